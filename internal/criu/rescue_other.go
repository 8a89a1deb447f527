//go:build linux && !amd64

package criu

import "time"

// RescueDirEnv names the directory where ferry's CRIU (patch 0015) keeps a
// record of each process its code is inside, for Rescue.
const RescueDirEnv = "CRIU_RESCUE_DIR"

// Rescue puts back processes whose CRIU died inside them. Putting one back
// writes its saved registers, whose layout is amd64's here: on other
// architectures nothing is rescued (ferry check's table says what patch
// 0015's absence costs: a CRIU that dies inside the container).
func Rescue(dir string) (rescued []int, err error) { return nil, nil }

// RescueWithin is Rescue until nothing is left to rescue: nothing here.
func RescueWithin(dir string, wait time.Duration) (rescued []int, err error) { return nil, nil }
