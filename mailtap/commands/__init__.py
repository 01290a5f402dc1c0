"""Sub-commands of the `mailtap` CLI, loaded lazily by mailtap.cli."""
