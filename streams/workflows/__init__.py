"""Built-in workflows, each a module meant to be copied:

- :mod:`streams.workflows.ticket_intake`: acknowledge with a stable ticket number, attach the thread.
- :mod:`streams.workflows.approval`: forward to an approver, relay the decision, remind.

Your own workflows live in any importable module listed in ``streams.workflow_modules``.
"""
