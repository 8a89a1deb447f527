package preflight

import (
	"fmt"
	"slices"
	"strings"

	"github.com/ferry-migrate/ferry/internal/criu"
)

// techniqueOrder is the order ferry check lists the techniques in
// (engine.Modes' keys).
var techniqueOrder = []string{"cold", "cold/rebuild", "precopy", "precopy/rebuild", "precopy/native", "postcopy", "hybrid"}

// patchReport says, for a CRIU carrying have, what each missing ferry
// patch costs and what that makes of each technique.
func patchReport(have criu.Patches) ([]MissingPatch, map[string]string) {
	missing := []MissingPatch{}
	lacks := have.Missing()
	for _, k := range lacks {
		missing = append(missing, MissingPatch{ID: k.ID, Title: k.Title, Side: string(k.Side), Effect: k.Effect.String(),
			Without: k.Without, Techniques: slices.Clone(k.Techniques)})
	}
	// What it cannot restore of what ferry's own CRIU dumps.
	var unreadable []string
	for _, k := range criu.Unreadable(criu.Ferrys(), have) {
		unreadable = append(unreadable, k.ID)
	}
	modes := map[string]string{}
	for _, tech := range techniqueOrder {
		var fails, some, slower []string
		for _, k := range lacks {
			if !slices.Contains(k.Techniques, tech) {
				continue
			}
			switch k.Effect {
			case criu.Fails:
				fails = append(fails, fmt.Sprintf("as %s without %s, where the runtime restores lazily", k.Side, k.ID))
			case criu.FailsSome:
				some = append(some, k.ID)
			default:
				slower = append(slower, k.ID)
			}
		}
		if len(unreadable) > 0 {
			fails = append(fails, "as destination of a source whose CRIU has ferry's patches (lacks "+strings.Join(unreadable, ", ")+")")
		}
		var parts []string
		if len(fails) > 0 {
			parts = append(parts, "fails "+strings.Join(fails, "; "))
		}
		if len(some) > 0 {
			parts = append(parts, "fails for some containers without "+strings.Join(some, ", "))
		}
		if len(slower) > 0 {
			parts = append(parts, "slower without "+strings.Join(slower, ", "))
		}
		if len(parts) == 0 {
			parts = []string{"as ferry means it"}
		}
		modes[tech] = strings.Join(parts, "; ")
	}
	return missing, modes
}

// patchesLine says in a few words which ferry patches the CRIU carries.
func patchesLine(have criu.Patches) string {
	n, total := 0, len(criu.KnownPatches)
	for _, k := range criu.KnownPatches {
		if have.Has(k.ID) {
			n++
		}
	}
	switch {
	case have == nil:
		return "none (a stock CRIU, or one ferry built before patch 0016)"
	case n == total:
		return fmt.Sprintf("all %d of ferry's (%s)", total, have)
	}
	var lacks []string
	for _, k := range have.Missing() {
		lacks = append(lacks, k.ID)
	}
	return fmt.Sprintf("%d of ferry's %d: lacks %s", n, total, strings.Join(lacks, ", "))
}

// patchText renders what the missing patches cost, by technique then by
// patch, for Text.
func (r Report) patchText(b *strings.Builder) {
	if len(r.CriuMissing) == 0 || r.CriuVersion == "" {
		return
	}
	fmt.Fprintf(b, "\nWith this CRIU (install ferry-criu or run `make setup` for ferry's patches):\n")
	for _, tech := range techniqueOrder {
		if m, ok := r.CriuModes[tech]; ok {
			fmt.Fprintf(b, "  %-16s %s\n", tech, m)
		}
	}
	fmt.Fprintf(b, "\nferry's CRIU patches missing here (scripts/criu-patches):\n")
	for _, m := range r.CriuMissing {
		fmt.Fprintf(b, "  %s %s [%s, %s]: %s\n", m.ID, m.Title, m.Side, m.Effect, m.Without)
	}
}
