#!/usr/bin/env bash
# The device tool sends the tracked working tree (limit 64 MiB); the repo's tracked files are larger (~90 MB), most
# of it fixtures/traces, which no GPU run needs. `on` untracks that folder in the index only (files stay on disk)
# and ignores it, so it does not travel; `off` restores the index from HEAD and the ignore list. Never commit
# between `on` and `off` (the index then holds the folder's deletion).
#
#   bash scripts/device_slim.sh on && <device run> ; bash scripts/device_slim.sh off
set -eu
cd "$(git rev-parse --show-toplevel)"
EXCLUDE=.git/info/exclude
case ${1:-} in
  on)
    git rm -r -q --cached fixtures/traces
    grep -qx '/fixtures/traces/' "$EXCLUDE" || echo '/fixtures/traces/' >> "$EXCLUDE"
    echo "tracked bytes that travel now: $(git ls-files -z | xargs -0 du -cb | tail -n 1 | cut -f1)" ;;
  off)
    git reset -q -- fixtures/traces
    sed -i '\#^/fixtures/traces/$#d' "$EXCLUDE"
    git status --short -- fixtures/traces | head -n 3 ;;
  *)
    echo "usage: $0 on|off" >&2; exit 2 ;;
esac
