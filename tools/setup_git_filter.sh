#!/bin/sh
# Set up git's clean filter for notebooks in this checkout (.gitattributes names it): what a run
# or a save adds to a notebook (outputs, counts, run metadata, widget state) never shows in
# `git status` nor blocks a `git pull`. Run by `make`, by docker compose's git-filter service,
# and once by hand on the conda path (README). Idempotent.
#
# The filter runs wherever git runs (the host, also for docker compose users), under python3:
# tools/strip_outputs.py needs only the standard library. Where python3 or the script is
# missing, `cat`: git never fails on the filter, it only stops hiding a run.
set -e
cd "$(dirname "$0")/.."
if ! git rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  echo "not a git checkout: no notebook filter to set up"
  exit 0
fi
git config filter.strip-outputs.clean \
  'if [ -f tools/strip_outputs.py ] && command -v python3 >/dev/null; then python3 tools/strip_outputs.py; else cat; fi'
git config filter.strip-outputs.smudge cat
echo "git: notebooks are stored without outputs and run metadata (tools/strip_outputs.py)"
