# doc_check_lib.sh: runs the shell blocks of a Markdown page verbatim, as a user would paste them
# (README.md: readme_check.sh; docs/GUIDE.md: guide_check.sh). Sourced, not run.
#
# The info string of a fenced block says what the check does with it:
#   ```bash tested            run: each block in page order, in a fresh `bash -euo pipefail`,
#                             the commands echoed as they run ("+ cmd")
#   ```bash needs=MODULE      run where python3 imports MODULE, else reported as skipped
#   ```bash not-run: REASON   not run (minutes long, needs a GPU, installs packages); REASON required
# Any other ```bash / ```sh / ```shell block fails the check: every command on the page either runs
# in the check or says why not. Blocks in other languages (```python, ```yaml, ```) are left alone.
#
# doc_setup SRC WORK QSHARD: WORK becomes a stand-in for a fresh checkout at SRC with only the
#   binary built: configs, data, docs, scripts and tests link to SRC's, build/qshard to QSHARD,
#   nothing else (so a command that needs another file fails here too). The launchers
#   (scripts/launch/*.sh) cd to WORK through the link, as they cd to the checkout.
# doc_run PAGE: runs PAGE's blocks in WORK; exits non-zero at the first failing block, naming the
#   page and the block's line.

doc_setup() {
  local src=$1 work=$2 qshard=$3
  rm -rf "$work" && mkdir -p "$work/build"
  local d
  for d in configs data docs scripts tests; do ln -s "$src/$d" "$work/$d"; done
  ln -s "$qshard" "$work/build/qshard"
  cd "$work"
}

doc_run() {
  local page=$1 blocks
  blocks=$(mktemp -d)
  # Split the page: blocks/N.sh with blocks/N.tag (the info string) and blocks/N.line (its line).
  awk -v dir="$blocks" '
    /^```/ {
      if (!inside) {
        info = substr($0, 4); gsub(/^[ \t]+|[ \t]+$/, "", info)
        inside = 1; n++; file = sprintf("%s/%03d", dir, n)
        print info > (file ".tag"); print NR > (file ".line"); printf "" > (file ".sh")
      } else {
        inside = 0
      }
      next
    }
    inside { print >> (file ".sh") }
  ' "$page"
  local ran=0 skipped=0 f tag line lang rc
  for f in "$blocks"/*.sh; do
    [ -e "$f" ] || continue
    tag=$(cat "${f%.sh}.tag") line=$(cat "${f%.sh}.line")
    lang=${tag%% *}
    case "$lang" in bash|sh|shell) ;; *) continue ;; esac
    case "$tag" in
      "$lang tested") ;;
      "$lang needs="*)
        local module=${tag#"$lang needs="}
        if ! python3 -c "import $module" 2>/dev/null; then
          echo "doc check: $page:$line: skipped (needs the Python module $module)"
          skipped=$((skipped + 1))
          continue
        fi ;;
      "$lang not-run: "?*) skipped=$((skipped + 1)); continue ;;
      *) echo "doc check: $page:$line: a \`\`\`$tag block is neither 'tested', 'needs=MODULE' nor 'not-run: REASON'"
         rm -rf "$blocks"; return 1 ;;
    esac
    echo "doc check: $page:$line: running"
    rc=0
    bash -euo pipefail -x "$f" 2>&1 || rc=$?
    if [ "$rc" != 0 ]; then
      echo "doc check: $page:$line: the block failed with exit $rc"
      rm -rf "$blocks"
      return 1
    fi
    ran=$((ran + 1))
  done
  rm -rf "$blocks"
  [ "$ran" -gt 0 ] || { echo "doc check: $page: no tested block"; return 1; }
  echo "doc check: $page: $ran blocks ran, $skipped not run"
}
