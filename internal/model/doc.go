// Package model predicts how long a migration takes and how long the
// service stops, for each of ferry's techniques, without running anything.
//
// It holds pure functions only:
//
//   - pam.go: the Processing-Aware Migration model (Calagna, Yu, Giaccone,
//     Chiasserini, ICC 2023), Eqs 1-20, for CRIU's native pre-copy.
//   - techniques.go: the same approach applied to how ferry really moves a
//     container (cold, content-based pre-copy, post-copy, hybrid).
//   - predict.go: the common entry points Predict and Best over a host
//     Profile and the workload's Inputs.
//   - baseline.go: the ideal pre-copy model PAM is compared with, and the
//     textbook timelines (Yu's MSc thesis, §2.2).
//   - cost.go: the thesis' monetary cost model for choosing a destination
//     (Eqs 7.1-7.14), with its units made consistent.
//   - fit.go: least-squares helpers to calibrate a Profile from measurements.
//
// Units: seconds, bytes, bytes per second, pages per second, unless a name
// says otherwise (…Ms is milliseconds). docs/MODEL.md has every equation,
// the choices made where the sources are ambiguous, and the defaults.
package model
