#!/usr/bin/env bash
# Sets up everything mailtap needs on a Debian machine, idempotently; a second run takes seconds.
#   1. Debian packages (Dovecot, Postfix, faketime, a JRE, Maven) - only those missing.
#   2. .venv with `pip install -e '.[all,dev]'` - only when pyproject.toml changed.
#   3. Kafka broker jars from Maven Central into .cache/kafka/libs - only when the pom changed.
# Called by `make venv` (and so by `make test` and `make demo`).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"

log() { echo "bootstrap: $*" >&2; }

sha256() { sha256sum "$1" | cut -d' ' -f1; }

# --- 1. Debian packages ------------------------------------------------------------------------

# package:command pairs; a package counts as present when dpkg says so or its command exists.
REQUIRED=(
  "dovecot-imapd:dovecot"
  # The other IMAP servers of the dev stack (`mailtap dev up --imap cyrus|courier`): their
  # common packages install side by side with Dovecot; the IMAP daemons themselves
  # (cyrus-imapd, courier-imap) conflict with dovecot-imapd (all provide imap-server), so
  # step 4 unpacks them into .cache instead of installing them.
  "cyrus-common:cyrmaster"
  # saslpasswd2 writes the private Cyrus instance's user database (sasldb).
  "sasl2-bin:saslpasswd2"
  # couriertcpd, maildirmake and the libraries of Courier's imapd.
  "courier-base:couriertcpd"
  "postfix:postfix"
  "faketime:faketime"
  "default-jre-headless:java"
  # javac: the Avro contract tests generate Java classes and compile them (test_java_avro.py).
  "default-jdk-headless:javac"
  "maven:mvn"
  # promtool checks deploy/observability's alert rules (tests/unit/deploy/test_observability.py).
  "prometheus:promtool"
  # the web console's browser tests (tests/integration/console) drive it through Playwright.
  "chromium:chromium"
)

python_ok() {
  "$1" -c 'import sys, venv, ensurepip; sys.exit(sys.version_info < (3, 11))' 2>/dev/null
}

find_python() {
  local candidate
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null && python_ok "$(command -v "$candidate")"; then
      command -v "$candidate"
      return 0
    fi
  done
  return 1
}

missing=()
for pair in "${REQUIRED[@]}"; do
  pkg="${pair%%:*}" cmd="${pair##*:}"
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
      && ! command -v "$cmd" >/dev/null && ! [ -x "/usr/sbin/$cmd" ]; then
    missing+=("$pkg")
  fi
done
if ! find_python >/dev/null; then
  missing+=(python3 python3-venv)
fi

if [ "${#missing[@]}" -gt 0 ]; then
  SUDO=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || {
      log "missing Debian packages: ${missing[*]}; run as root or install them"; exit 1; }
    SUDO=(sudo)
  fi
  log "installing Debian packages: ${missing[*]}"
  # Postfix asks which mail setup to configure; mailtap runs private instances with its own config.
  echo "postfix postfix/main_mailer_type select No configuration" \
    | "${SUDO[@]}" debconf-set-selections
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# --- 2. Python virtualenv ------------------------------------------------------------------------

VENV="$ROOT/.venv"
STAMP="$VENV/.mailtap-pyproject-sha256"
if ! [ -x "$VENV/bin/python" ] || ! python_ok "$VENV/bin/python"; then
  PYTHON="$(find_python)" || { log "no Python >= 3.11 with venv found"; exit 1; }
  log "creating $VENV with $PYTHON"
  rm -rf "$VENV"
  "$PYTHON" -m venv "$VENV"
fi
want="$(sha256 pyproject.toml)"
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  log "installing mailtap (editable) with extras all,dev into $VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q -e ".[all,dev]"
  echo "$want" > "$STAMP"
fi

# --- 3. Kafka jars -----------------------------------------------------------------------------

POM="$ROOT/deploy/local/kafka/pom.xml"
LIBS="$ROOT/.cache/kafka/libs"
KSTAMP="$ROOT/.cache/kafka/.pom-sha256"
want="$(sha256 "$POM")"
if [ "$(cat "$KSTAMP" 2>/dev/null)" != "$want" ] || ! compgen -G "$LIBS/kafka_2.13-*.jar" >/dev/null; then
  log "resolving the Kafka jars with Maven into $LIBS"
  rm -rf "$LIBS.tmp"
  mvn -q -B -f "$POM" dependency:copy-dependencies \
    -DoutputDirectory="$LIBS.tmp" -DincludeScope=runtime
  rm -rf "$LIBS"
  mv "$LIBS.tmp" "$LIBS"
  echo "$want" > "$KSTAMP"
fi

# --- 4. Cyrus and Courier IMAP daemons ------------------------------------------------------------

# `apt-get download` + `dpkg-deb -x`: the packages' files under .cache/imap-servers/<package>,
# nothing registered with dpkg, no system service. mailtap/dev/cyrus.py and courier.py run them.
SERVERS="$ROOT/.cache/imap-servers"
for pkg in cyrus-imapd courier-imap; do
  version="$(apt-cache policy "$pkg" | awk '/Candidate:/ {print $2}')"
  if [ -z "$version" ] || [ "$version" = "(none)" ]; then
    log "no Debian package $pkg in the apt sources; \`mailtap dev up --imap ${pkg%%-*}\` will not work"
    continue
  fi
  if [ "$(cat "$SERVERS/$pkg/.version" 2>/dev/null)" != "$version" ]; then
    log "unpacking $pkg $version into $SERVERS/$pkg"
    tmp="$(mktemp -d)"
    chmod 755 "$tmp"  # apt's _apt user downloads into it
    (cd "$tmp" && apt-get download -q "$pkg=$version" >/dev/null)
    rm -rf "$SERVERS/$pkg"
    mkdir -p "$SERVERS/$pkg"
    dpkg-deb -x "$tmp"/"${pkg}"_*.deb "$SERVERS/$pkg"
    echo "$version" > "$SERVERS/$pkg/.version"
    rm -rf "$tmp"
  fi
done

log "ready (.venv, .cache/kafka/libs, .cache/imap-servers, Debian packages)"
