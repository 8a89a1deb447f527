#!/bin/sh
# ferry's runc for Docker (a Docker runtime: dockerd --add-runtime
# ferry-runc=/usr/libexec/ferry/docker-runc). It is runc, except that a
# restore of a checkpoint ferry made runs CRIU with the configuration file
# the checkpoint carries (ferry-criu.conf: leave-stopped), so that the
# restored processes stay stopped until ferry's commit continues them.
# Docker 20.10 passes no OCI annotations, through which runc would name
# the file itself.
prev=
for a in "$@"; do
	if [ "$prev" = --image-path ] && [ -f "$a/ferry-criu.conf" ]; then
		CRIU_CONFIG_FILE="$a/ferry-criu.conf"
		export CRIU_CONFIG_FILE
	fi
	prev=$a
done
exec runc "$@"
