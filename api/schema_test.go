package api

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"testing"

	"github.com/invopop/jsonschema"
)

var updateSchema = flag.Bool("update-schema", false, "rewrite docs/report.schema.json from the Report type")

const reportSchemaPath = "../docs/report.schema.json"

// reportSchema is the JSON Schema of Report, generated from the Go type
// and its field comments.
func reportSchema(t *testing.T) []byte {
	t.Helper()
	r := &jsonschema.Reflector{DoNotReference: false}
	if err := r.AddGoComments("github.com/ferry-migrate/ferry/api", "./"); err != nil {
		t.Fatal(err)
	}
	s := r.Reflect(&Report{})
	s.ID = "https://github.com/ferry-migrate/ferry/docs/report.schema.json"
	s.Title = "ferry migration report"
	s.Description = "What `ferry migrate --json`, `ferry wait --json` and `ferry ps --all --json` print for one migration (schema_version " +
		jsonNumber(ReportSchemaVersion) + ")."
	b, err := json.MarshalIndent(s, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	return append(b, '\n')
}

func jsonNumber(n int) string { b, _ := json.Marshal(n); return string(b) }

// docs/report.schema.json is the schema of the Report type as it is (go
// test ./api -run TestReportSchema -update-schema rewrites it).
func TestReportSchema(t *testing.T) {
	want := reportSchema(t)
	if *updateSchema {
		if err := os.WriteFile(reportSchemaPath, want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(reportSchemaPath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("%s is not the Report type's schema: run go test ./api -run TestReportSchema -update-schema", reportSchemaPath)
	}
	// Every field a report carries is in it, by its JSON name.
	var schema struct {
		Defs map[string]struct {
			Properties map[string]json.RawMessage `json:"properties"`
			Required   []string                   `json:"required"`
		} `json:"$defs"`
	}
	if err := json.Unmarshal(got, &schema); err != nil {
		t.Fatal(err)
	}
	props := schema.Defs["Report"].Properties
	for _, k := range []string{"schema_version", "id", "started_at", "ferry_version", "container", "downtime_ms", "source_state", "logs", "rounds", "phases"} {
		if _, ok := props[k]; !ok {
			t.Errorf("the schema has no %q", k)
		}
	}
}
