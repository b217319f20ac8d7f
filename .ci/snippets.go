//go:build ignore

// Command snippets builds every Go snippet of the documentation: the ```go
// fences of the Markdown files named on the command line and the code blocks
// (tab-indented lines) of the doc comments of the .go files named there. Run
// it through .ci/snippets, from the repository root:
//
//	bash .ci/snippets                      # the default file set
//	go run .ci/snippets.go README.md x/doc.go  # just these
//
// Each snippet becomes a package of a scratch module
// (github.com/pgxlock/pgxlock/internal/snippets, so that internal packages
// resolve) in a temporary workspace that also uses every module of the
// repository's go.work, and the lot is compiled with go build and go vet.
// Errors point at the snippet's own file and line (//line directives).
//
// A snippet is one of
//   - a file (it has a package clause): built as it is;
//   - declarations (func, type, var, const, import): put in a file of their own;
//   - statements: the body of a function returning error (so `return err`
//     works; `return nil` is added unless the snippet ends in a return).
//
// Imports are added for the package names the snippet uses (the table below),
// and the names it uses but does not declare come from a prelude (ctx, pool,
// locker, err, ...: prelude below). Names a snippet needs beyond those are
// declared in a comment the renderer hides, right before the fence:
//
//	<!-- snippet-context: var tenant int64; func runJob(context.Context) error -->
//
// and in a doc.go file, in a line comment outside the package doc:
//
//	// snippet-context: func migrate(context.Context, *pgx.Conn) error
//
// which applies to every block of that file, or in .ci/snippets.context, a
// line "FILE: DECLARATIONS" for every block of FILE. Every variable a statement
// snippet declares at its top level is marked used, so fragments that show a
// result without using it compile. A doc-comment block that is not Go (SQL,
// output, a table) is skipped when it does not parse as Go or names no package
// of the table; a Markdown fence tagged go is always checked.
package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/format"
	"go/parser"
	"go/token"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
)

// imports maps the package names snippets use to their import paths.
var imports = map[string]string{
	"advisory":       "github.com/pgxlock/pgxlock/advisory",
	"keys":           "github.com/pgxlock/pgxlock/keys",
	"lease":          "github.com/pgxlock/pgxlock/lease",
	"pooltx":         "github.com/pgxlock/pgxlock/pooltx",
	"metrics":        "github.com/pgxlock/pgxlock/metrics",
	"pgtest":         "github.com/pgxlock/pgxlock/internal/pgtest",
	"pgxlockgocron":  "github.com/pgxlock/pgxlock/contrib/gocron",
	"pgxlockgoose":   "github.com/pgxlock/pgxlock/contrib/goose",
	"pgxlockotel":    "github.com/pgxlock/pgxlock/contrib/otel",
	"pgxlockmigrate": "github.com/pgxlock/pgxlock/contrib/migrate",
	"pgx":            "github.com/jackc/pgx/v5",
	"pgxpool":        "github.com/jackc/pgx/v5/pgxpool",
	"pgconn":         "github.com/jackc/pgx/v5/pgconn",
	"stdlib":         "github.com/jackc/pgx/v5/stdlib",
	"gocron":         "github.com/go-co-op/gocron/v2",
	"goose":          "github.com/pressly/goose/v3",
	"lock":           "github.com/pressly/goose/v3/lock",
	"migrate":        "github.com/golang-migrate/migrate/v4",
	"pgxmigrate":     "github.com/golang-migrate/migrate/v4/database/pgx/v5",
	"source":         "github.com/golang-migrate/migrate/v4/source",
	"prometheus":     "github.com/prometheus/client_golang/prometheus",
	"promhttp":       "github.com/prometheus/client_golang/prometheus/promhttp",
	"otel":           "go.opentelemetry.io/otel",
	"context":        "context",
	"errors":         "errors",
	"fmt":            "fmt",
	"log":            "log",
	"slog":           "log/slog",
	"time":           "time",
	"sql":            "database/sql",
	"fs":             "io/fs",
	"os":             "os",
	"http":           "net/http",
	"testing":        "testing",
	"strings":        "strings",
	"sync":           "sync",
	"signal":         "os/signal",
}

// prelude declares the names snippets use without declaring them.
const prelude = `
var (
	ctx        context.Context
	pool       *pgxpool.Pool
	db         *sql.DB
	conn       *pgx.Conn
	tx         pgx.Tx
	locker     *advisory.Locker
	key        keys.Key
	err        error
	migrations fs.FS
)
`

type snippet struct {
	file string // as given on the command line
	line int    // of the first line of the code
	code string
	ctx  string // snippet-context declarations
	md   bool   // from a Markdown fence
}

var contextRE = regexp.MustCompile(`(?s)<!--\s*snippet-context:(.*?)-->`)

func markdown(path string) ([]snippet, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	lines := strings.Split(string(b), "\n")
	var out []snippet
	pendingCtx := ""
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.Contains(l, "<!--") && strings.Contains(strings.Join(lines[i:min(i+20, len(lines))], "\n"), "snippet-context:") {
			rest := strings.Join(lines[i:], "\n")
			if m := contextRE.FindStringSubmatchIndex(rest); m != nil && m[0] == strings.Index(rest, "<!--") {
				pendingCtx = rest[m[2]:m[3]]
				i += strings.Count(rest[:m[1]], "\n")
				continue
			}
		}
		t := strings.TrimSpace(l)
		if !strings.HasPrefix(t, "```") {
			continue
		}
		lang := strings.TrimSpace(strings.TrimPrefix(t, "```"))
		start := i + 1
		j := start
		for j < len(lines) && !strings.HasPrefix(strings.TrimSpace(lines[j]), "```") {
			j++
		}
		if lang == "go" {
			out = append(out, snippet{file: path, line: start + 1, code: strings.Join(lines[start:j], "\n"), ctx: pendingCtx, md: true})
		}
		pendingCtx = ""
		i = j
	}
	return out, nil
}

var fileCtxRE = regexp.MustCompile(`(?m)^// snippet-context:(.*)$`)

func docComments(path string) ([]snippet, error) {
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
	if err != nil {
		return nil, err
	}
	src, _ := os.ReadFile(path)
	var ctxs []string
	for _, m := range fileCtxRE.FindAllStringSubmatch(string(src), -1) {
		ctxs = append(ctxs, m[1])
	}
	var out []snippet
	var groups []*ast.CommentGroup
	if f.Doc != nil {
		groups = append(groups, f.Doc)
	}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.GenDecl:
			if d.Doc != nil {
				groups = append(groups, d.Doc)
			}
		case *ast.FuncDecl:
			if d.Doc != nil {
				groups = append(groups, d.Doc)
			}
		}
	}
	for _, g := range groups {
		var block []string
		first := 0
		flush := func() {
			// Drop trailing blank lines.
			for len(block) > 0 && strings.TrimSpace(block[len(block)-1]) == "" {
				block = block[:len(block)-1]
			}
			if len(block) > 0 {
				out = append(out, snippet{file: path, line: first, code: strings.Join(block, "\n"), ctx: strings.Join(ctxs, "\n")})
			}
			block = nil
		}
		for _, c := range g.List {
			text := c.Text
			if !strings.HasPrefix(text, "//") {
				continue
			}
			text = strings.TrimPrefix(text, "//")
			line := fset.Position(c.Pos()).Line
			switch {
			case strings.HasPrefix(text, "\t"):
				if block == nil {
					first = line
				}
				block = append(block, strings.TrimPrefix(text, "\t"))
			case strings.TrimSpace(text) == "" && block != nil:
				block = append(block, "")
			default:
				flush()
			}
		}
		flush()
	}
	return out, nil
}

type kind int

const (
	notGo kind = iota
	fileKind
	declKind
	stmtKind
)

func classify(code string) (kind, *ast.File) {
	fset := token.NewFileSet()
	if f, err := parser.ParseFile(fset, "", code, 0); err == nil {
		return fileKind, f
	}
	if f, err := parser.ParseFile(fset, "", "package p\n"+code, 0); err == nil {
		return declKind, f
	}
	if f, err := parser.ParseFile(fset, "", "package p\nfunc _() error {\n"+code+"\n}", 0); err == nil {
		return stmtKind, f
	}
	return notGo, nil
}

// usedPackages returns the package names of the table that f uses as X.Sel
// and does not declare itself.
func usedPackages(f *ast.File) []string {
	declared := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.AssignStmt:
			if n.Tok == token.DEFINE {
				for _, l := range n.Lhs {
					if id, ok := l.(*ast.Ident); ok {
						declared[id.Name] = true
					}
				}
			}
		case *ast.ValueSpec:
			for _, id := range n.Names {
				declared[id.Name] = true
			}
		case *ast.Field:
			for _, id := range n.Names {
				declared[id.Name] = true
			}
		case *ast.FuncDecl:
			declared[n.Name.Name] = true
		case *ast.ImportSpec:
			if n.Name != nil {
				declared[n.Name.Name] = true
			} else {
				p := strings.Trim(n.Path.Value, `"`)
				declared[p[strings.LastIndex(p, "/")+1:]] = true
			}
		}
		return true
	})
	seen := map[string]bool{}
	ast.Inspect(f, func(n ast.Node) bool {
		if s, ok := n.(*ast.SelectorExpr); ok {
			if id, ok := s.X.(*ast.Ident); ok && imports[id.Name] != "" && !declared[id.Name] {
				seen[id.Name] = true
			}
		}
		return true
	})
	var names []string
	for n := range seen {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

func importBlock(names []string) string {
	if len(names) == 0 {
		return ""
	}
	var b strings.Builder
	b.WriteString("import (\n")
	for _, n := range names {
		p := imports[n]
		if p[strings.LastIndex(p, "/")+1:] == n || strings.HasSuffix(p, "/"+n+"/v2") || strings.HasSuffix(p, "/"+n+"/v3") || strings.HasSuffix(p, "/"+n+"/v4") || strings.HasSuffix(p, "/"+n+"/v5") {
			fmt.Fprintf(&b, "\t%q\n", p)
		} else {
			fmt.Fprintf(&b, "\t%s %q\n", n, p)
		}
	}
	b.WriteString(")\n")
	return b.String()
}

// topLevelDefined returns the names the statements of the wrapper function
// body declare at the function's top level.
func topLevelDefined(f *ast.File) []string {
	var names []string
	for _, d := range f.Decls {
		fd, ok := d.(*ast.FuncDecl)
		if !ok || fd.Name.Name != "_" {
			continue
		}
		for _, st := range fd.Body.List {
			switch st := st.(type) {
			case *ast.AssignStmt:
				if st.Tok == token.DEFINE {
					for _, l := range st.Lhs {
						if id, ok := l.(*ast.Ident); ok && id.Name != "_" {
							names = append(names, id.Name)
						}
					}
				}
			case *ast.DeclStmt:
				if g, ok := st.Decl.(*ast.GenDecl); ok && g.Tok == token.VAR {
					for _, s := range g.Specs {
						for _, id := range s.(*ast.ValueSpec).Names {
							if id.Name != "_" {
								names = append(names, id.Name)
							}
						}
					}
				}
			}
		}
	}
	return names
}

// endsInReturn reports whether the wrapper's body ends in a return statement.
func endsInReturn(f *ast.File) bool {
	for _, d := range f.Decls {
		if fd, ok := d.(*ast.FuncDecl); ok && fd.Name.Name == "_" && len(fd.Body.List) > 0 {
			_, ok := fd.Body.List[len(fd.Body.List)-1].(*ast.ReturnStmt)
			return ok
		}
	}
	return false
}

func topDecls(f *ast.File) map[string]bool {
	m := map[string]bool{}
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if d.Recv == nil {
				m[d.Name.Name] = true
			}
		case *ast.GenDecl:
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					for _, id := range s.Names {
						m[id.Name] = true
					}
				case *ast.TypeSpec:
					m[s.Name.Name] = true
				}
			}
		}
	}
	return m
}

// preludeFor returns the prelude and context declarations without the names
// the snippet declares at package level.
func preludeFor(ctx string, skip map[string]bool) (string, error) {
	src := "package p\n" + prelude + "\n" + ctx + "\n"
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, "", src, 0)
	if err != nil {
		return "", fmt.Errorf("snippet-context does not parse: %v\n%s", err, ctx)
	}
	var keep []ast.Decl
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			if !skip[d.Name.Name] {
				if d.Body == nil { // a signature: give it a body
					stub, _ := parser.ParseFile(fset, "", "package p\nfunc _() { panic(0) }", 0)
					d.Body = stub.Decls[0].(*ast.FuncDecl).Body
				}
				keep = append(keep, d)
			}
		case *ast.GenDecl:
			var specs []ast.Spec
			for _, s := range d.Specs {
				switch s := s.(type) {
				case *ast.ValueSpec:
					var names []*ast.Ident
					for _, id := range s.Names {
						if !skip[id.Name] {
							names = append(names, id)
						}
					}
					if len(names) > 0 {
						s.Names = names
						s.Values = nil
						specs = append(specs, s)
					}
				case *ast.TypeSpec:
					if !skip[s.Name.Name] {
						specs = append(specs, s)
					}
				default:
					specs = append(specs, s)
				}
			}
			if len(specs) > 0 {
				d.Specs = specs
				keep = append(keep, d)
			}
		}
	}
	f.Decls = keep
	var b bytes.Buffer
	if err := format.Node(&b, fset, f); err != nil {
		return "", err
	}
	body := b.String()
	body = body[strings.Index(body, "\n")+1:] // drop "package p"
	pf, _ := parser.ParseFile(token.NewFileSet(), "", "package p\n"+body, 0)
	return importBlock(usedPackages(pf)) + body, nil
}

// looksLikeGo reports whether code reads as Go statements rather than a
// table, SQL or output: it has a short variable declaration, or a line that
// begins with a call into a package of the table (pgxlockmigrate.Wrap(...)).
func looksLikeGo(code string) bool {
	if strings.Contains(code, ":=") {
		return true
	}
	for _, line := range strings.Split(code, "\n") {
		line = strings.TrimSpace(line)
		for name := range imports {
			rest, ok := strings.CutPrefix(line, name+".")
			if ok && rest != "" && rest[0] >= 'A' && rest[0] <= 'Z' && strings.Contains(rest, "(") {
				return true
			}
		}
	}
	return false
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == "--" {
		os.Args = append(os.Args[:1], os.Args[2:]...) // .ci/snippets: files after --, so go run takes no .go file for its own
	}
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: go run .ci/snippets.go FILE.md|FILE.go ...")
		os.Exit(2)
	}
	root, _ := os.Getwd()
	readSideContext(filepath.Join(root, ".ci", "snippets.context"))
	var all []snippet
	for _, p := range os.Args[1:] {
		var s []snippet
		var err error
		if strings.HasSuffix(p, ".md") {
			s, err = markdown(p)
		} else {
			s, err = docComments(p)
		}
		if err != nil {
			fatal(err)
		}
		for i := range s {
			s[i].ctx = sideContext[filepath.Clean(p)] + "\n" + s[i].ctx
		}
		all = append(all, s...)
	}
	tmp, err := os.MkdirTemp("", "pgxlock-snippets-")
	if err != nil {
		fatal(err)
	}
	if os.Getenv("SNIPPETS_KEEP") == "" {
		defer os.RemoveAll(tmp)
	} else {
		fmt.Println("scratch module kept in", tmp)
	}
	write := func(name, text string) {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(tmp, name)), 0o755); err != nil {
			fatal(err)
		}
		if err := os.WriteFile(filepath.Join(tmp, name), []byte(text), 0o644); err != nil {
			fatal(err)
		}
	}
	write("go.mod", "module github.com/pgxlock/pgxlock/internal/snippets\n\ngo 1.25.7\n")
	write("go.work", workspace(root))
	checked, skipped := 0, 0
	failed := false
	for i, s := range all {
		k, f := classify(s.code)
		if k == notGo || (!s.md && len(usedPackages(f)) == 0) {
			if s.md {
				fmt.Printf("%s:%d: a go fence that does not parse as Go (file, declarations or statements)\n", s.file, s.line)
				failed = true
			} else if k == notGo && looksLikeGo(s.code) {
				// A doc-comment block that calls into a package of the
				// table (pgxlockmigrate.Wrap, advisory.New) is meant as Go:
				// one that does not parse is a broken snippet, not prose.
				fmt.Printf("%s:%d: a doc-comment code block that uses a Go package but does not parse as Go\n", s.file, s.line)
				failed = true
			}
			skipped++
			continue
		}
		abs, _ := filepath.Abs(s.file)
		dir := fmt.Sprintf("s%03d", i)
		line := fmt.Sprintf("//line %s:%d\n", abs, s.line)
		var skip map[string]bool
		var body string
		switch k {
		case fileKind:
			write(dir+"/snippet.go", line+s.code+"\n")
			skip = topDecls(f)
		case declKind:
			skip = topDecls(f)
			imp := ""
			if len(f.Imports) == 0 {
				imp = importBlock(usedPackages(f))
			}
			body = "package snippet\n\n" + imp + line + s.code + "\n"
			write(dir+"/snippet.go", body)
		case stmtKind:
			var tail strings.Builder
			if !endsInReturn(f) {
				for _, n := range topLevelDefined(f) {
					fmt.Fprintf(&tail, "\t_ = %s\n", n)
				}
				tail.WriteString("\treturn nil\n")
			}
			body = "package snippet\n\n" + importBlock(usedPackages(f)) + "\nfunc _() error {\n" + line + s.code + "\n" + "//line snippet-wrapper:1\n" + tail.String() + "}\n"
			write(dir+"/snippet.go", body)
		}
		pkg := "snippet"
		if k == fileKind {
			pkg = f.Name.Name
		}
		p, err := preludeFor(s.ctx, skip)
		if err != nil {
			fmt.Printf("%s:%d: %v\n", s.file, s.line, err)
			failed = true
			continue
		}
		write(dir+"/prelude.go", "package "+pkg+"\n\n"+p)
		checked++
	}
	fmt.Printf("%d Go snippets to build (%d doc-comment blocks that are not Go skipped)\n", checked, skipped)
	for _, args := range [][]string{{"build", "-gcflags=-e", "./..."}, {"vet", "./..."}} {
		cmd := exec.Command("go", args...)
		cmd.Dir = tmp
		cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(tmp, "go.work"), "GOFLAGS=")
		out, err := cmd.CombinedOutput()
		if err != nil {
			fmt.Printf("go %s:\n%s", strings.Join(args, " "), rel(string(out), root))
			failed = true
			break
		}
	}
	if failed {
		fmt.Println("FAIL: a Go snippet of the docs does not build (see .ci/snippets.go for how snippets are wrapped)")
		os.Exit(1)
	}
	fmt.Println("every Go snippet builds")
}

// workspace returns a go.work that uses the repository's modules (absolute
// paths, with its replace lines) and the scratch module.
func workspace(root string) string {
	cmd := exec.Command("go", "work", "edit", "-json")
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "GOWORK="+filepath.Join(root, "go.work"))
	out, err := cmd.Output()
	if err != nil {
		fatal(fmt.Errorf("go work edit -json: %v", err))
	}
	var w struct {
		Go      string
		Use     []struct{ DiskPath string }
		Replace []struct {
			Old struct{ Path, Version string }
			New struct{ Path, Version string }
		}
	}
	if err := json.Unmarshal(out, &w); err != nil {
		fatal(err)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "go %s\n\nuse (\n\t.\n", w.Go)
	for _, u := range w.Use {
		fmt.Fprintf(&b, "\t%s\n", filepath.Join(root, u.DiskPath))
	}
	b.WriteString(")\n")
	for _, r := range w.Replace {
		np := r.New.Path
		if strings.HasPrefix(np, ".") {
			np = filepath.Join(root, np)
		}
		old := r.Old.Path
		if r.Old.Version != "" {
			old += " " + r.Old.Version
		}
		fmt.Fprintf(&b, "replace %s => %s %s\n", old, np, r.New.Version)
	}
	return b.String()
}

// sideContext holds the declarations of .ci/snippets.context, by file: for
// docs whose files cannot carry a hidden comment, or that another package
// owns. Each line is "FILE: DECLARATIONS"; # starts a comment line.
var sideContext = map[string]string{}

func readSideContext(path string) {
	b, err := os.ReadFile(path)
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(b), "\n") {
		if t := strings.TrimSpace(l); t == "" || strings.HasPrefix(t, "#") {
			continue
		}
		file, decls, ok := strings.Cut(l, ":")
		if !ok {
			fatal(fmt.Errorf("%s: %q is not FILE: DECLARATIONS", path, l))
		}
		f := filepath.Clean(strings.TrimSpace(file))
		sideContext[f] += decls + "\n"
	}
}

func rel(s, root string) string { return strings.ReplaceAll(s, root+"/", "") }

func fatal(err error) {
	fmt.Fprintln(os.Stderr, "snippets:", err)
	os.Exit(2)
}
