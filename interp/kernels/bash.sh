# airlock bash kernel prelude.
#
# github.com/airlock-dev/airlock/interp runs `bash --norc --noprofile --noediting +m -i` with this
# prelude and then the cells on stdin. The shell is interactive so that
# SIGINT aborts the whole command being run (loops, functions and all) and
# returns to reading the next command, as at a terminal, instead of ending
# the shell. Each cell arrives as three lines:
#
#   __airlock_code=$'...'; __airlock_go=1
#   [[ -n $__airlock_go ]] && eval "$__airlock_code" </dev/null 4>&- 5>&- 6>&-
#   __airlock_end TOKEN N $?
#
# so user code reads /dev/null as stdin and never sees the protocol fds:
# 4 messages (JSON lines) and 5, 6 duplicates of stdout and stderr used for
# the sync markers "\0airlock-sync:TOKEN\0" that order messages after output.
PS1= PS2= PS3= PS4='+ '
set +H +o history
unset PROMPT_COMMAND MAIL MAILPATH HISTFILE
shopt -s expand_aliases
exec 3<&-
__airlock_go=
__airlock_sync() {
	__airlock_s1=0 __airlock_s2=0
	\builtin printf '\000airlock-sync:%s\000' "$1" 2>/dev/null >&5 && __airlock_s1=1
	\builtin printf '\000airlock-sync:%s\000' "$1" 2>/dev/null >&6 && __airlock_s2=1
}
__airlock_ready() {
	__airlock_sync "$1"
	\builtin printf '{"type":"ready","pid":%d,"version":"%s","sync":[%d,%d]}\n' "$$" "$BASH_VERSION" "$__airlock_s1" "$__airlock_s2" >&4 || \builtin exit 70
}
__airlock_end() {
	\builtin local __airlock_status=$3
	__airlock_go=
	__airlock_sync "$1"
	\builtin printf '{"type":"end","n":%d,"status":%d,"sync":[%d,%d]}\n' "$2" "$__airlock_status" "$__airlock_s1" "$__airlock_s2" >&4 || \builtin exit 70
}
