# Sourced (not run) by .ci/run and hack/test.sh: the wall time of each
# phase, printed as one table when the outermost of them exits, also when a
# phase failed.
#
#   phase NAME CMD...            runs CMD (a command, not a shell function),
#                                records NAME, its wall time and how it
#                                ended, and returns CMD's status
#   phase_row DEPTH NAME SECONDS RESULT
#                                records a time measured otherwise, DEPTH
#                                levels below this script's own phases
#   phase_since START            seconds since START (an $EPOCHREALTIME)
#   phase_table                  prints the table, if this script made it
#
# The rows go to the file $MACVTAP_PHASE_TIMES. The first script makes it
# and prints it at exit; a script it runs (hack/test.sh from .ci/run)
# finds it in its environment and adds its rows one level deeper, so they
# land in the caller's table. A row is `id, depth, name, seconds, result`,
# written when a phase starts and again when it ends: the table lists
# phases in the order they started and says which did not finish.

if [[ -n ${MACVTAP_PHASE_TIMES:-} && -f $MACVTAP_PHASE_TIMES && -w $MACVTAP_PHASE_TIMES ]]; then
  PHASE_DEPTH=$(( ${MACVTAP_PHASE_DEPTH:-0} + 1 ))
  PHASE_OWNER=0
else
  MACVTAP_PHASE_TIMES=$(mktemp "${TMPDIR:-/tmp}/macvtap-phases.XXXXXX")
  PHASE_DEPTH=0
  PHASE_OWNER=1
fi
export MACVTAP_PHASE_TIMES
export MACVTAP_PHASE_DEPTH=$PHASE_DEPTH

phase_since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# phase_write ID DEPTH NAME SECONDS RESULT
phase_write() {
  local IFS=$'\t'
  printf '%s\n' "$*" >>"$MACVTAP_PHASE_TIMES"
}

phase_next_id() { echo $(( $(wc -l <"$MACVTAP_PHASE_TIMES") + 1 )); }

phase() {
  local name=$1 t=$EPOCHREALTIME rc=0 id; shift
  id=$(phase_next_id)
  phase_write "$id" "$PHASE_DEPTH" "$name" "" running
  "$@" || rc=$?
  phase_write "$id" "$PHASE_DEPTH" "$name" "$(phase_since "$t")" \
    "$(if (( rc == 0 )); then echo ok; else echo "failed (exit $rc)"; fi)"
  return "$rc"
}

phase_row() {
  phase_write "$(phase_next_id)" "$(( PHASE_DEPTH + $1 ))" "$2" "$3" "$4"
}

phase_table() {
  [[ $PHASE_OWNER == 1 && -f $MACVTAP_PHASE_TIMES ]] || return 0
  echo >&2
  awk -F '\t' '
    function human(s,   m) {
      if (s == "") return "-"
      if (s < 60) return sprintf("%.1f s", s)
      s = int(s + 0.5); m = int(s / 60)
      if (m < 60) return sprintf("%d min %d s", m, s % 60)
      return sprintf("%d h %d min %d s", int(m / 60), m % 60, s % 60)
    }
    !($1 in seen) { seen[$1] = 1; order[++n] = $1 }
    { depth[$1] = $2; name[$1] = $3; secs[$1] = $4; result[$1] = $5 }
    END {
      w = length("phase")
      for (i = 1; i <= n; i++) {
        id = order[i]; label[id] = name[id]
        for (d = 0; d < depth[id]; d++) label[id] = "  " label[id]
        if (length(label[id]) > w) w = length(label[id])
      }
      fmt = "%-" w "s  %16s  %s\n"
      printf fmt, "phase", "wall time", "result"
      for (i = 1; i <= n; i++) {
        id = order[i]
        printf fmt, label[id], human(secs[id]), (result[id] == "running" ? "did not finish" : result[id])
      }
    }' "$MACVTAP_PHASE_TIMES" >&2
  rm -f "$MACVTAP_PHASE_TIMES"
}
