//go:build linux

// Command containerd-shim-ferry-v2 is containerd's runc shim (v2.4.2's
// containerd-shim-runc-v2) whose task service can restore a container
// from a ferry migration's checkpoint: see package restore and
// api/restoreshim.
//
// containerd runs it as runtime_type io.containerd.runc.v2 with
// runtime_path pointing here, so it keeps runc's name: the name is only
// what the shim logs under and reports in its runtime info.
package main

import (
	"context"

	"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2/manager"
	"github.com/containerd/containerd/v2/pkg/shim"

	// Registers the "task" TTRPC plugin in place of containerd's
	// task/plugin, which must not be imported too: a second "task"
	// plugin makes the registry panic at start.
	_ "github.com/ferry-migrate/ferry/tools/kube/shim/restore"
)

func main() {
	shim.RunShim(context.Background(), manager.NewShimManager("io.containerd.runc.v2"))
}
