package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/pgxlock/pgxlock/internal/history"
)

// check merges the workers' histories and runs the linearizability checker (porcupine,
// with the exclusive/shared lock model of internal/history, partitioned by key) over
// them, bounded by cfg.CheckLimit. It fills in the verdict, the cost and, on failure,
// the path of porcupine's HTML visualisation.
func check(cfg config, journals []string, crashed []string, res *result) error {
	var ops []history.Op
	for _, path := range journals {
		o, err := history.ReadFile(path)
		if err != nil {
			return err
		}
		ops = append(ops, o...)
	}
	for _, proc := range crashed {
		ops = history.Crashed(ops, proc)
	}
	v := history.Run(history.LockModel(), ops, cfg.CheckLimit)
	res.Events, res.CheckTime = v.Ops, v.Took
	switch v.Result {
	case porcupine.Ok:
		res.Verdict = verdictOK
		return nil
	case porcupine.Illegal:
		res.Verdict = verdictFail
	default:
		res.Verdict = verdictUnknown
	}
	path := cfg.HTML
	if path == "" {
		path = filepath.Join(os.TempDir(), fmt.Sprintf("pgxlock-soak-%s.html", time.Now().UTC().Format("20060102T150405")))
	}
	if err := v.WriteHTML(path); err != nil {
		return err
	}
	res.HTML = path
	return nil
}
