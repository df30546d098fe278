#!/bin/sh
# The test suite leaves /tmp as it found it: `before` lists what loip and the specs make there
# (lua_* from os.tmpname, loip-*: heads' directories, benchmark stores), `after` fails naming
# anything new. Usage: tmp_watch.sh before|after LIST_FILE
set -eu
list() { ls -1 /tmp 2>/dev/null | grep -E '^(lua_|loip-)' | sort || true; }
case "$1" in
  before) list > "$2" ;;
  after)
    new=$(list | comm -13 "$2" -)
    rm -f "$2"
    if [ -n "$new" ]; then
      echo "the tests left in /tmp:" >&2
      echo "$new" | sed 's|^|  /tmp/|' >&2
      exit 1
    fi ;;
  *) echo "usage: tmp_watch.sh before|after LIST_FILE" >&2; exit 2 ;;
esac
