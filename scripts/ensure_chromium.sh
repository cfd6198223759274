#!/usr/bin/env sh
# The browser tests drive Debian's chromium through Playwright (Playwright's own browser
# download needs the internet). Install it when missing; `make test` runs this first.
# In CI (CI set, as .ci/run sets it) a browser that cannot be installed fails the run: the
# browser tests are the only ones that cover the drawing, CSP in a browser and the live list, and
# a green run without them proves nothing. A developer's machine gets a loud skip instead.
set -u
CHROMIUM=${CHROMIUM:-/usr/bin/chromium}
[ -x "$CHROMIUM" ] && exit 0
if command -v apt-get >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; elif sudo -n true 2>/dev/null; then SUDO="sudo -n"; else SUDO=none; fi
  if [ "$SUDO" != none ]; then
    echo "Installing chromium for the browser tests (apt-get install chromium)..."
    $SUDO apt-get update -qq \
      && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends chromium >/dev/null \
      && [ -x "$CHROMIUM" ] && exit 0
  fi
fi
echo "" >&2
echo "!!! $CHROMIUM is missing and could not be installed (needs root and apt-get)." >&2
if [ -n "${CI:-}" ]; then
  echo "!!! CI is set: the browser tests cannot be skipped here, so the run FAILS." >&2
  echo "" >&2
  exit 1
fi
echo "!!! The browser tests will be SKIPPED. Install Debian's chromium to run them." >&2
echo "" >&2
exit 0
