// Package manifests reads Kubernetes objects from YAML files, as kubectl
// apply -f DIR -R would, for `make run` and the tests.
package manifests

import (
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"

	"github.com/crossplane/crossplane-runtime/v2/pkg/errors"
)

// Load returns every object in the .yaml and .yml files below the given paths
// (files or directories), in lexical path order and document order. Empty
// documents are skipped; a document without apiVersion or kind is an error
// naming its file.
func Load(paths ...string) ([]*unstructured.Unstructured, error) {
	var files []string
	for _, p := range paths {
		err := filepath.WalkDir(p, func(path string, d fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			if !d.IsDir() && (strings.HasSuffix(path, ".yaml") || strings.HasSuffix(path, ".yml")) {
				files = append(files, path)
			}
			return nil
		})
		if err != nil {
			return nil, errors.Wrapf(err, "cannot read %s", p)
		}
	}
	sort.Strings(files)

	var objs []*unstructured.Unstructured
	for _, f := range files {
		o, err := loadFile(f)
		if err != nil {
			return nil, err
		}
		objs = append(objs, o...)
	}
	return objs, nil
}

func loadFile(path string) ([]*unstructured.Unstructured, error) {
	f, err := os.Open(path) //nolint:gosec // paths come from the repository or the user
	if err != nil {
		return nil, errors.Wrap(err, "cannot open manifest")
	}
	defer func() { _ = f.Close() }()

	var objs []*unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(f, 4096)
	for i := 0; ; i++ {
		u := &unstructured.Unstructured{}
		err := dec.Decode(&u.Object)
		if errors.Is(err, io.EOF) {
			return objs, nil
		}
		if err != nil {
			return nil, errors.Wrapf(err, "%s: document %d", path, i)
		}
		if len(u.Object) == 0 {
			continue
		}
		if u.GetAPIVersion() == "" || u.GetKind() == "" {
			return nil, errors.Errorf("%s: document %d has no apiVersion or kind", path, i)
		}
		objs = append(objs, u)
	}
}
