//go:build tools

// Package vegeta pins the vegeta command that hack/vegeta/build.py builds, so that
// `go mod tidy` keeps it (and its go.sum lines) in this module.
package vegeta

import (
	_ "github.com/tsenart/vegeta/v12"
)
