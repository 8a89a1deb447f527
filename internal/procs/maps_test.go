package procs

import (
	"slices"
	"testing"
)

func TestPrivateMappings(t *testing.T) {
	maps := `55d0c0a00000-55d0c0a21000 r--p 00000000 fd:01 1234 /usr/bin/prog
55d0c0a21000-55d0c0a22000 rw-p 00021000 fd:01 1234 /usr/bin/prog
7f0000000000-7f0000100000 rw-p 00000000 00:00 0
7f0000100000-7f0000200000 ---p 00000000 00:00 0
7f0000200000-7f0000300000 rw-s 00000000 00:01 77 /dev/zero (deleted)
7f0000300000-7f0000301000 -w-p 00000000 00:00 0
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
7ffd00100000-7ffd00104000 r--p 00000000 00:00 0                          [vvar]
7ffd00104000-7ffd00105000 r--p 00000000 00:00 0                          [vvar_vclock]
7ffd00105000-7ffd00107000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
garbage line
`
	got := PrivateMappings([]byte(maps))
	want := []Mapping{
		{0x55d0c0a00000, 0x55d0c0a21000, "r--p", "/usr/bin/prog"},
		{0x55d0c0a21000, 0x55d0c0a22000, "rw-p", "/usr/bin/prog"},
		{0x7f0000000000, 0x7f0000100000, "rw-p", ""},
		{0x7f0000300000, 0x7f0000301000, "-w-p", ""},
		{0x7ffd00000000, 0x7ffd00021000, "rw-p", "[stack]"},
	}
	if !slices.Equal(got, want) {
		t.Fatalf("PrivateMappings:\n got %+v\nwant %+v", got, want)
	}
}

func TestParseMapsPaths(t *testing.T) {
	got := ParseMaps([]byte("7f0000200000-7f0000300000 rw-s 00000000 00:01 77 /dev/zero (deleted)\n" +
		"7ffd00105000-7ffd00107000 r-xp 00000000 00:00 0 [vdso]"))
	want := []Mapping{{0x7f0000200000, 0x7f0000300000, "rw-s", "/dev/zero (deleted)"}, {0x7ffd00105000, 0x7ffd00107000, "r-xp", "[vdso]"}}
	if !slices.Equal(got, want) {
		t.Fatalf("ParseMaps:\n got %+v\nwant %+v", got, want)
	}
	if got[0].Private() || !got[1].Private() || !got[1].Executable() || !got[1].Readable() || got[0].Executable() {
		t.Errorf("permissions misread: %+v", got)
	}
}
