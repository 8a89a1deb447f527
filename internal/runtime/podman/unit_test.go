package podman

import (
	"testing"
)

func TestQualify(t *testing.T) {
	for in, want := range map[string]string{
		"ferry-ptest":                "localhost/ferry-ptest:latest",
		"ferry-ptest:v1":             "localhost/ferry-ptest:v1",
		"localhost/ferry":            "localhost/ferry:latest",
		"lab/ferry:2":                "localhost/lab/ferry:2",
		"quay.io/x/y":                "quay.io/x/y:latest",
		"localhost:5000/ferry":       "localhost:5000/ferry:latest",
		"localhost:5000/ferry:v2":    "localhost:5000/ferry:v2",
		"docker.io/library/busybox":  "docker.io/library/busybox:latest",
		"localhost/ferry-ptest:last": "localhost/ferry-ptest:last",
	} {
		if got := qualify(in); got != want {
			t.Errorf("qualify(%q) = %q, want %q", in, got, want)
		}
	}
}
