package host

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ferry-migrate/ferry/internal/testroot"
)

// The scratch root is made private; one made first by another user, or
// below a directory another user could rewrite, is refused.
func TestSecureWorkRoot(t *testing.T) {
	testroot.Require(t, "needs root: files owned by another user are made")
	base := t.TempDir()
	if err := os.Chmod(base, 0o755); err != nil {
		t.Fatal(err)
	}
	mine := filepath.Join(base, "a", "scratch")
	if err := (Config{ScratchDir: mine}).SecureWorkRoot(); err != nil {
		t.Fatal(err)
	}
	if st, err := os.Stat(mine); err != nil || st.Mode().Perm() != 0o700 {
		t.Fatalf("made %v %v", st, err)
	}
	// Ours but open: narrowed.
	if err := os.Chmod(mine, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := (Config{ScratchDir: mine}).SecureWorkRoot(); err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(mine); st.Mode().Perm() != 0o700 {
		t.Errorf("mode %o left", st.Mode().Perm())
	}
	// Someone else's.
	theirs := filepath.Join(base, "theirs")
	if err := os.Mkdir(theirs, 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(theirs, 65534, 65534); err != nil {
		t.Fatal(err)
	}
	if err := (Config{ScratchDir: theirs}).SecureWorkRoot(); err == nil || !strings.Contains(err.Error(), "uid 65534") {
		t.Errorf("a scratch root another user made: %v", err)
	}
	// Ours, below someone else's.
	if err := (Config{ScratchDir: filepath.Join(theirs, "x")}).SecureWorkRoot(); err == nil || !strings.Contains(err.Error(), "belongs to uid 65534") {
		t.Errorf("below another user's directory: %v", err)
	}
	// A link in its place.
	link := filepath.Join(base, "link")
	if err := os.Symlink(mine, link); err != nil {
		t.Fatal(err)
	}
	if err := (Config{ScratchDir: link}).SecureWorkRoot(); err == nil || !strings.Contains(err.Error(), "not a directory") {
		t.Errorf("a link: %v", err)
	}
}
