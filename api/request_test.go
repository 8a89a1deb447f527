package api

import (
	"encoding/json"
	"testing"
)

// An older CLI's runc_root arrives as runc's root option; a request with
// options keeps them through JSON.
func TestRequestRuntimeOptions(t *testing.T) {
	var r Request
	if err := json.Unmarshal([]byte(`{"container":"web","to":"h2","mode":"cold","runc_root":"/run/app"}`), &r); err != nil {
		t.Fatal(err)
	}
	if r.Container != "web" || r.RuntimeOptions["runc"][RuncOptionRoot] != "/run/app" {
		t.Fatalf("%+v", r)
	}
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	var back Request
	if err := json.Unmarshal(b, &back); err != nil || back.RuntimeOptions["runc"][RuncOptionRoot] != "/run/app" {
		t.Fatalf("%s: %+v, %v", b, back, err)
	}
}
