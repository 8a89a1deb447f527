package runc

import (
	"encoding/json"
	"fmt"
	"os"
)

// CRIUConfigAnnotation is the OCI annotation naming the CRIU configuration
// file runc hands CRIU for a container (without it runc names
// /etc/criu/runc.conf).
const CRIUConfigAnnotation = "org.criu.config"

// LeaveStopped writes a CRIU configuration file at path that leaves the
// processes a restore brings back stopped (SIGSTOP), so that a copy that
// is never committed never runs; ContinueAll lets them run. The runtime
// reports such a container running. After the restore, call
// ClearCRIUConfig: runc hands the same file to later dumps, which must
// not leave the container stopped.
func LeaveStopped(path string) error {
	return os.WriteFile(path, []byte("leave-stopped\n"), 0o600)
}

// ClearCRIUConfig empties the file LeaveStopped wrote, keeping it: the
// container's annotation still names it.
func ClearCRIUConfig(path string) error {
	return os.WriteFile(path, nil, 0o600)
}

// AnnotateCRIUConfig sets a bundle's config.json to name conf as its CRIU
// configuration file, keeping every other field as it is.
func AnnotateCRIUConfig(configJSON, conf string) error {
	b, err := os.ReadFile(configJSON)
	if err != nil {
		return err
	}
	var spec map[string]json.RawMessage
	if err := json.Unmarshal(b, &spec); err != nil {
		return fmt.Errorf("%s: %w", configJSON, err)
	}
	ann := map[string]string{}
	if raw, ok := spec["annotations"]; ok && string(raw) != "null" {
		if err := json.Unmarshal(raw, &ann); err != nil {
			return fmt.Errorf("%s: annotations: %w", configJSON, err)
		}
	}
	ann[CRIUConfigAnnotation] = conf
	if spec["annotations"], err = json.Marshal(ann); err != nil {
		return err
	}
	if b, err = json.MarshalIndent(spec, "", "  "); err != nil {
		return err
	}
	st, err := os.Stat(configJSON)
	if err != nil {
		return err
	}
	return os.WriteFile(configJSON, b, st.Mode().Perm())
}
