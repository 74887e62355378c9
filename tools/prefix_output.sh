#!/usr/bin/env bash
# tools/prefix_output.sh NAME COMMAND [ARGS...]
# Runs COMMAND with every line of its output (stdout and stderr) prefixed by
# "[NAME] ", and exits with COMMAND's status. `make test` runs the two stacks'
# suites side by side; the prefix tells their lines apart in one log.
set -o pipefail
name=$1
shift
"$@" 2>&1 | sed -u "s/^/[$name] /"
