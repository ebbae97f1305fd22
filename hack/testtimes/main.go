// Command testtimes reads `go test -json` output (other lines are passed
// over) and prints each package's start, wall time and, when the tests ran
// under hack/cputime, CPU time, longest first:
//
//	make test GO_TEST_FLAGS="-count=1 -json -exec $PWD/bin/cputime" > test.log
//	go run ./hack/testtimes < test.log
//
// On a machine whose cores every package shares, a package's wall time
// depends on what ran beside it; its CPU time is what it costs.
package main

import (
	"bufio"
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// event is the part of a test2json event this reads.
type event struct {
	Time    time.Time
	Action  string
	Package string
	Test    string
	Output  string
	Elapsed float64
}

type pkg struct {
	name       string
	start, end time.Time
	cpu        float64 // seconds; 0 when not measured
	result     string
}

var cpuLine = regexp.MustCompile(`^cputime: \S+: ([0-9.]+) s CPU`)

func main() {
	pkgs, first, err := read(os.Stdin)
	if err != nil {
		fmt.Fprintln(os.Stderr, "testtimes:", err)
		os.Exit(1)
	}
	list := make([]*pkg, 0, len(pkgs))
	var cpu float64
	for _, p := range pkgs {
		list = append(list, p)
		cpu += p.cpu
	}
	slices.SortFunc(list, func(a, b *pkg) int { return cmp.Compare(b.end.Sub(b.start), a.end.Sub(a.start)) })
	w := tabwriter.NewWriter(os.Stdout, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(w, "start s\twall s\tCPU s\tresult\t package")
	for _, p := range list {
		fmt.Fprintf(w, "%.0f\t%.0f\t%s\t%s\t %s\n", p.start.Sub(first).Seconds(), p.end.Sub(p.start).Seconds(), seconds(p.cpu), p.result, p.name)
	}
	_ = w.Flush()
	if cpu > 0 {
		fmt.Printf("CPU in all: %.0f s\n", cpu)
	}
}

// read gathers each package's first and last event, result and CPU line.
func read(r io.Reader) (map[string]*pkg, time.Time, error) {
	pkgs := map[string]*pkg{}
	var first time.Time
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 16<<20)
	for s.Scan() {
		line := s.Bytes()
		if len(line) == 0 || line[0] != '{' {
			continue
		}
		var e event
		if json.Unmarshal(line, &e) != nil || e.Package == "" || e.Time.IsZero() {
			continue
		}
		if first.IsZero() || e.Time.Before(first) {
			first = e.Time
		}
		p, ok := pkgs[e.Package]
		if !ok {
			p = &pkg{name: e.Package, start: e.Time, end: e.Time}
			pkgs[e.Package] = p
		}
		p.start, p.end = minTime(p.start, e.Time), maxTime(p.end, e.Time)
		if e.Test == "" && (e.Action == "pass" || e.Action == "fail" || e.Action == "skip") {
			p.result = e.Action
		}
		if m := cpuLine.FindStringSubmatch(strings.TrimSpace(e.Output)); m != nil {
			p.cpu, _ = strconv.ParseFloat(m[1], 64)
		}
	}
	return pkgs, first, s.Err()
}

func seconds(s float64) string {
	if s == 0 {
		return "-"
	}
	return fmt.Sprintf("%.0f", s)
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func maxTime(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}
