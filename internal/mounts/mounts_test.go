package mounts

import (
	"reflect"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	info := strings.Join([]string{
		`22 1 254:0 / / rw,relatime - ext4 /dev/vda rw`,
		`40 22 254:0 /tmp/h/storage/overlay /tmp/h/storage/overlay rw - ext4 /dev/vda rw`,
		`41 40 0:50 / /tmp/h/storage/overlay/abc/merged rw - overlay overlay rw`,
		`42 22 0:51 / /tmp/h/storage/overlay-containers/abc/userdata/shm rw - tmpfs shm rw`,
		`43 22 0:52 / /tmp/hother/x rw - tmpfs tmpfs rw`,
		`44 22 0:53 / /tmp/h/with\040space rw - tmpfs tmpfs rw`,
		`45 22 0:54 / /tmp/h rw - tmpfs tmpfs rw`,
	}, "\n")
	got, err := Parse(strings.NewReader(info), "/tmp/h/")
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"/tmp/h/storage/overlay-containers/abc/userdata/shm",
		"/tmp/h/storage/overlay/abc/merged",
		"/tmp/h/storage/overlay",
		"/tmp/h/with space",
		"/tmp/h",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("Parse = %q, want %q", got, want)
	}
}

func TestUnescapeMount(t *testing.T) {
	for in, want := range map[string]string{
		`/a/b`:          "/a/b",
		`/a\040b`:       "/a b",
		`/a\011\134x`:   "/a\t\\x",
		`/trailing\`:    `/trailing\`,
		`/short\04`:     `/short\04`,
		`/end\040`:      "/end ",
		`/notoctal\999`: `/notoctal\999`,
	} {
		if got := unescapeMount(in); got != want {
			t.Errorf("unescapeMount(%q) = %q, want %q", in, got, want)
		}
	}
}

// The image ID must depend only on the layer, so that every host loading
// the same rootfs gets the same ID.

func TestParseOverlay(t *testing.T) {
	info := strings.Join([]string{
		`22 1 254:0 / / rw,relatime - ext4 /dev/vda rw`,
		`46 27 0:40 / /b/rootfs rw,relatime - overlay overlay rw,lowerdir=/img/a:/img/b,upperdir=/b/upper,workdir=/b/work,uuid=on`,
		`47 27 0:41 / /c/rootfs rw,relatime shared:5 - overlay overlay rw,lowerdir=/img/with\054comma,upperdir=/c/u,workdir=/c/w`,
		`48 27 0:42 / /d/rootfs rw - tmpfs tmpfs rw`,
		`49 27 0:43 / /e/rootfs rw - overlay overlay rw,lowerdir=/img/a,upperdir=/e/u,workdir=/e/w`,
		`50 49 0:44 / /e/rootfs rw - tmpfs tmpfs rw`,
		`51 27 0:45 / /f/rootfs rw - overlay overlay rw,lowerdir=/img/a\:b,upperdir=/f/u,workdir=/f/w`,
	}, "\n")
	for _, c := range []struct {
		dir  string
		want *Overlay
		err  bool
	}{
		{dir: "/b/rootfs/", want: &Overlay{Lower: []string{"/img/a", "/img/b"}, Upper: "/b/upper", Work: "/b/work"}},
		{dir: "/c/rootfs", want: &Overlay{Lower: []string{"/img/with,comma"}, Upper: "/c/u", Work: "/c/w"}},
		{dir: "/d/rootfs"},            // not an overlay
		{dir: "/e/rootfs"},            // an overlay covered by a tmpfs
		{dir: "/x/rootfs"},            // no mount
		{dir: "/f/rootfs", err: true}, // an escaped colon
	} {
		got, err := ParseOverlay(strings.NewReader(info), c.dir)
		if (err != nil) != c.err {
			t.Fatalf("%s: err = %v, want error %v", c.dir, err, c.err)
		}
		if !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: = %+v, want %+v", c.dir, got, c.want)
		}
	}
}
