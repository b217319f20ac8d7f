package pgxlockmigrate_test

import (
	"testing"

	"github.com/pgxlock/pgxlock/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }
