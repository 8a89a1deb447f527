#!/bin/sh
# ferry's runc for Docker (a Docker runtime: dockerd --add-runtime
# ferry-runc=/usr/libexec/ferry/docker-runc). It is runc, except that a
# restore of a checkpoint ferry made runs CRIU with the configuration file
# the checkpoint carries (ferry-criu.conf: leave-stopped, so that the
# restored processes stay stopped until ferry's commit continues them;
# lazy-pages, so that their memory comes from ferry's lazy-pages daemon).
# Docker 20.10 passes no OCI annotations, through which runc would name
# the file itself.
conf=
prev=
for a in "$@"; do
	if [ "$prev" = --image-path ] && [ -f "$a/ferry-criu.conf" ]; then
		conf="$a/ferry-criu.conf"
	fi
	prev=$a
done
if [ -n "$conf" ]; then
	CRIU_CONFIG_FILE=$conf
	export CRIU_CONFIG_FILE
	# runc asks CRIU over RPC for a work directory of its own (containerd's
	# shim names one) and says lazy-pages and tcp-established yes or no,
	# which overrides the file: where the file asks for them, runc is
	# asked instead (a lazy restore's work directory is where the
	# lazy-pages daemon's socket is).
	work=$(sed -n 's/^work-dir //p' "$conf")
	lazy=$(grep -x lazy-pages "$conf")
	tcp=$(grep -x tcp-established "$conf")
	skip=
	inserted=
	for a; do
		shift
		if [ -n "$skip" ]; then
			skip=
			continue
		fi
		case $a in
		--work-path) [ -n "$work" ] && skip=1 && continue ;;
		--work-path=*) [ -n "$work" ] && continue ;;
		esac
		set -- "$@" "$a"
		if [ -z "$inserted" ] && [ "$a" = restore ]; then
			inserted=1
			[ -n "$work" ] && set -- "$@" --work-path "$work"
			[ -n "$lazy" ] && set -- "$@" --lazy-pages
			[ -n "$tcp" ] && set -- "$@" --tcp-established
		fi
	done
fi
exec runc "$@"
