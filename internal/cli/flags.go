package cli

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/ferry-migrate/ferry/internal/dirty"
	"github.com/ferry-migrate/ferry/internal/engine"
	"github.com/ferry-migrate/ferry/internal/model"
	"github.com/ferry-migrate/ferry/internal/units"
)

// AddPrecopyFlags adds the pre-copy stop rule and stream options.
func AddPrecopyFlags(cmd *cobra.Command, o *engine.PrecopyOptions) {
	f := cmd.Flags()
	f.IntVar(&o.MaxRounds, "max-rounds", 8, "pre-copy: at most this many rounds before the switchover")
	o.MinRoundBytes = 4 << 20
	f.Var(units.BytesVar(&o.MinRoundBytes), "min-round-bytes", "pre-copy: switch over once a round sends fewer bytes (64K, 4M, 4096)")
	f.DurationVar(&o.MaxDowntime, "max-downtime", 0, "downtime budget (e.g. 500ms): pre-copy switches over once its prediction fits; auto refuses when no technique fits")
	f.BoolVar(&o.AutoConverge, "auto-converge", false, "pre-copy: throttle the container's CPU step by step while rounds do not shrink")
	f.StringVar(&o.Compress, "compress", "none", "pre-copy round stream compression: none or zstd")
	f.StringVar(&o.Engine, "precopy-engine", "auto", "pre-copy engine: auto (native where the kernel tracks dirty pages), native (CRIU pre-dump), content (ferry's page hashing)")
	f.StringVar(&o.WriteTracking, "write-tracking", engine.TrackingAuto, "content pre-copy and hybrid: auto (rounds read only the pages the kernel saw written since the round before: userfaultfd write protection, Linux 6.7+; processes it cannot track are read whole) or off (every round reads and hashes all memory)")
	f.StringVar(&o.Switchover, "switchover", "auto", "how content pre-copy and cold end: rebuild (CRIU dumps without memory while the frozen memory goes as a last round, for pre-copy only what changed; the destination completes the images from its copy) or dump (a full CRIU dump; pre-copy's refers to the pages the destination holds); auto: pre-copy rebuilds where CRIU's lazy dump works, cold where the runtime's restore copies its images (Docker) and it can restore lazily")
}

// LoadProfile reads a calibrated profile, or returns the defaults with
// this host's write tracking (a calibrated profile records its host's).
func LoadProfile(path string) (model.Profile, string, error) {
	if path == "" {
		p := model.DefaultProfile()
		p.WriteTracking = dirty.Available() == nil
		if p.WriteTracking {
			return p, "defaults, with this host's write tracking", nil
		}
		return p, "defaults", nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return model.Profile{}, "", fmt.Errorf("--profile: %w", err)
	}
	p, err := model.ParseProfile(b)
	if err != nil {
		return model.Profile{}, "", fmt.Errorf("--profile %s: %w", path, err)
	}
	return p, path, nil
}
