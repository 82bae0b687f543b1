package agent

import (
	"go/ast"
	"go/build"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestPackageFloors holds the agent's layout (docs/design.md, "Who owns what"): each unit
// imports only the units on lower floors, so that no loop's state can be reached from below.
func TestPackageFloors(t *testing.T) {
	const mod = "github.com/reprieve-dev/reprieve/agent/"
	floor := map[string]int{
		// The Kubernetes client, under every unit that calls the API server.
		"kube":    -1,
		"metrics": 0, "events": 0, "serve": 0, "plan": 0, "notify": 0,
		// What a Node shows (pure), and the executable's pages (wired by main).
		"nodefacts": 0, "residency": 0,
		"record": 1, "evict": 1,
		"interrupt": 2, "pressure": 2, "guard": 2,
		// The configuration: flags, defaults and validation, over the values it describes.
		"config": 2,
		// The features the wiring assembles, each in its own package.
		"volumes": 3, "preflight": 3, "informer": 3, "podnotice": 3,
		"whatif": 4,
	}
	dirs, err := filepath.Glob("*/*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, d := range dirs {
		if _, ok := floor[filepath.Dir(d)]; !ok {
			t.Errorf("agent/%s has no floor here: add it to the table and to docs/design.md", filepath.Dir(d))
		}
	}
	for pkg, f := range floor {
		p, err := build.ImportDir(filepath.Join(".", pkg), 0)
		if err != nil {
			t.Fatalf("reading agent/%s: %v", pkg, err)
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, mod) {
				continue
			}
			dep := strings.TrimPrefix(imp, mod)
			df, known := floor[dep]
			switch {
			case !known:
				t.Errorf("agent/%s imports agent/%s, which has no floor here: add it to the table and to docs/design.md", pkg, dep)
			case df >= f:
				t.Errorf("agent/%s (floor %d) imports agent/%s (floor %d): a unit imports only lower floors", pkg, f, dep, df)
			}
		}
	}
}

// TestMethodsStayTogether: no type of the agent has methods in more than two files, so that
// who owns a type's state can be read in one place (issue 20).
func TestMethodsStayTogether(t *testing.T) {
	dirs, err := filepath.Glob("*")
	if err != nil {
		t.Fatal(err)
	}
	dirs = append(dirs, ".")
	for _, dir := range dirs {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil || len(files) == 0 {
			continue
		}
		where := map[string]map[string]bool{}
		fset := token.NewFileSet()
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			af, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
			if err != nil {
				t.Fatalf("parsing %s: %v", f, err)
			}
			for _, d := range af.Decls {
				fd, ok := d.(*ast.FuncDecl)
				if !ok || fd.Recv == nil || len(fd.Recv.List) == 0 {
					continue
				}
				typ := fd.Recv.List[0].Type
				if star, ok := typ.(*ast.StarExpr); ok {
					typ = star.X
				}
				if idx, ok := typ.(*ast.IndexExpr); ok {
					typ = idx.X
				}
				id, ok := typ.(*ast.Ident)
				if !ok {
					continue
				}
				if where[id.Name] == nil {
					where[id.Name] = map[string]bool{}
				}
				where[id.Name][filepath.Base(f)] = true
			}
		}
		for typ, fs := range where {
			if len(fs) > 2 {
				t.Errorf("%s: type %s has methods in %d files %v; keep a type's methods in at most two", dir, typ, len(fs), fs)
			}
		}
	}
}

// TestRootIsWiring: the agent package itself wires the units together and holds no feature of
// its own (issue 51): a feature gets its own package under agent/, with a floor above.
func TestRootIsWiring(t *testing.T) {
	const maxFiles, maxLines = 5, 1000
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	var n, lines int
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		n++
		lines += strings.Count(string(b), "\n")
	}
	if n > maxFiles || lines > maxLines {
		t.Errorf("agent/ holds %d files and %d lines besides its tests; the wiring is at most %d files and %d lines: give the feature a package of its own",
			n, lines, maxFiles, maxLines)
	}
}
