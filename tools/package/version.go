package main

import (
	"regexp"
	"strings"
)

var (
	// describedRe is git describe past a tag: TAG-N-gHASH.
	describedRe = regexp.MustCompile(`^(.+)-([0-9]+)-g([0-9a-f]{4,64})$`)
	// tagRe is a release tag: v1, 1.2, v1.2.3-rc.1.
	tagRe = regexp.MustCompile(`^v?[0-9]`)
	// hashRe is a bare commit, as git describe --always gives it without a tag.
	hashRe = regexp.MustCompile(`^[0-9a-f]{7,64}$`)
	// notInVersion is what a Debian upstream version may not hold (no
	// hyphen: the package has no Debian revision).
	notInVersion = regexp.MustCompile(`[^A-Za-z0-9.+~]`)
)

// debVersion turns git describe's output (--tags --always --dirty) into a
// Debian version that sorts as the releases do:
//
//	v1.2.3              1.2.3
//	v1.2.3-4-gabc1234   1.2.3+4.gabc1234   (after 1.2.3, before 1.2.4)
//	v2.0.0-rc.1         2.0.0~rc.1         (before 2.0.0)
//	...-dirty           ...+dirty, or .dirty after a +
//	4d6026f             0.0.0~git4d6026f   (a clone without tags: below any release)
//
// Anything else (dev, a tag not starting with a digit) also becomes
// 0.0.0~git<it>, with the characters a version may not hold as dots.
func debVersion(describe string) string {
	v := strings.TrimSpace(describe)
	dirty := strings.HasSuffix(v, "-dirty")
	v = strings.TrimSuffix(v, "-dirty")
	tag, commits, hash := v, "", ""
	if m := describedRe.FindStringSubmatch(v); m != nil {
		tag, commits, hash = m[1], m[2], m[3]
	}
	var out string
	switch {
	case commits == "" && hashRe.MatchString(v):
		out = "0.0.0~git" + v
	case tagRe.MatchString(tag):
		upstream, meta, _ := strings.Cut(strings.TrimPrefix(tag, "v"), "+")
		out = clean(strings.ReplaceAll(upstream, "-", "~"))
		if meta != "" {
			out += "+" + clean(meta)
		}
		if commits != "" {
			out = plus(out, commits+".g"+hash)
		}
	default:
		if v == "" {
			v = "unknown"
		}
		out = "0.0.0~git" + clean(v)
	}
	if dirty {
		out = plus(out, "dirty")
	}
	return out
}

func clean(s string) string { return notInVersion.ReplaceAllString(s, ".") }

// plus appends s after a + (after a dot when the version already has one).
func plus(v, s string) string {
	if strings.Contains(v, "+") || strings.Contains(v, "~git") {
		return v + "." + s
	}
	return v + "+" + s
}
