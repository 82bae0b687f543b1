package kubelet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"

	"sigs.k8s.io/yaml"
)

// Location is where a platform's node bootstrap writes the kubelet's configuration file, and the
// drop-in directory it passes as the kubelet's --config-dir, if any. Paths are the host's.
type Location struct {
	Platform  string
	Path      string
	DropInDir string
}

// Locations are the known places of the kubelet's configuration, in the order FindConfig tries
// them: each platform's own path first, kubeadm's generic /var/lib/kubelet/config.yaml last, as
// other tools also write there. No two platforms share a path, so the order matters only on a
// node that carries files from more than one.
var Locations = []Location{
	// nodeadm, awslabs/amazon-eks-ami nodeadm/internal/kubelet/config.go (kubeletConfigRoot,
	// kubeletConfigFile, kubeletConfigDir): --config=config.json and, from kubelet 1.29,
	// --config-dir=config.json.d (when the NodeConfig has kubelet settings: always on Karpenter's
	// nodes) with nodeadm's own drop-in 40-nodeadm.conf (writeKubeletConfig, at 81fec2e8) holding
	// the user's NodeConfig kubelet settings.
	{Platform: "EKS AL2023 (nodeadm)", Path: "/etc/kubernetes/kubelet/config.json", DropInDir: "/etc/kubernetes/kubelet/config.json.d"},
	// awslabs/amazon-eks-ami templates/al2/runtime/kubelet-config.json, installed there and passed
	// as --config by bootstrap.sh and the kubelet unit.
	{Platform: "EKS AL2", Path: "/etc/kubernetes/kubelet/kubelet-config.json"},
	// bottlerocket-os/bottlerocket-core-kit packages/kubernetes-1.*/kubelet.service:
	// --config /etc/kubernetes/kubelet/config, rendered from its kubelet-config template.
	{Platform: "Bottlerocket", Path: "/etc/kubernetes/kubelet/config"},
	// kubernetes/kubernetes cluster/gce/gci/configure-helper.sh (and GKE's node images): the
	// kube-env KUBELET_CONFIG written to /home/kubernetes/kubelet-config.yaml, passed as --config.
	{Platform: "GKE", Path: "/home/kubernetes/kubelet-config.yaml"},
	// Azure/AgentBaker parts/linux/cloud-init/artifacts/cse_config.sh (KUBELET_CONFIG_JSON_PATH)
	// and 10-componentconfig.conf (KUBELET_CONFIG_FILE_FLAGS="--config /etc/default/kubeletconfig.json").
	{Platform: "AKS", Path: "/etc/default/kubeletconfig.json"},
	// kubeadm: kubernetes/kubernetes cmd/kubeadm/app/constants (KubeletConfigurationFileName under
	// KubeletRunDirectory), written by kubeadm init and join.
	{Platform: "kubeadm", Path: DefaultConfigPath},
}

// Lookup says where FindConfig looks for the kubelet's configuration.
type Lookup struct {
	// HostRoot is where the host's filesystem is mounted; Path and DropInDir are under it.
	HostRoot string
	// Path is the configuration file (--kubelet-config); empty searches Locations.
	Path string
	// DropInDir is the drop-in directory (--kubelet-config-dir); empty takes the found
	// location's, or none for a path that is not a known location.
	DropInDir string
}

// FindConfig finds the kubelet's configuration file and reads it with its drop-ins.
//
// An explicit Path wins: when it does not exist the configuration is unknown (Found false, Path
// and Searched naming it); the known locations are not tried in its place. Without one, the
// Locations are tried in order and the first file that exists wins; when none does, Searched
// lists them all. Either way an unknown configuration holds the kubelet's defaults (DefaultConfig)
// for a caller that must go on, with Found false so that it says what it assumed.
//
// The drop-ins are those of DropInDir, or of the location found (or named by Path), merged as
// the kubelet merges --config-dir (mergeDropIns). An explicit DropInDir that does not exist is
// an error; a location's that does not exist means none.
//
// A file that exists but cannot be parsed, and a drop-in that does not merge, is an error naming
// it: the kubelet would not start with it either. One that this process may not read (AKS's is
// root's only) is unknown, its entry in Searched saying why.
func FindConfig(l Lookup) (Config, error) {
	candidates := Locations
	if l.Path != "" {
		candidates = []Location{{Path: l.Path}}
		for _, loc := range Locations {
			if filepath.Clean(l.Path) == loc.Path {
				candidates[0] = loc // a known file keeps its platform's drop-ins
			}
		}
	}
	var searched []string
	for _, loc := range candidates {
		path := filepath.Join(l.HostRoot, loc.Path)
		searched = append(searched, path)
		data, err := readMainFile(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			continue // absent, or a parent is a file: not there either
		}
		if errors.Is(err, fs.ErrPermission) {
			// There, but not for this process: AKS writes /etc/default/kubeletconfig.json 0600,
			// root's only, and the agent runs as non-root. Unknown, and said so (Searched), not
			// an error that would turn pressure handling off on every such node.
			searched[len(searched)-1] = fmt.Sprintf("%s (exists, not readable by this process: %v)", path, err)
			c := DefaultConfig()
			c.Path, c.Platform, c.Searched = path, loc.Platform, searched
			return c, nil
		}
		if err != nil {
			return Config{Path: path, Searched: searched}, fmt.Errorf("reading kubelet config: %w", err)
		}
		c, err := loadConfig(path, data, l, loc)
		c.Path, c.Platform, c.Searched = path, loc.Platform, searched
		if err != nil {
			return c, err
		}
		c.Found = true
		return c, nil
	}
	c := DefaultConfig()
	c.Searched = searched
	if l.Path != "" {
		c.Path = searched[0]
	}
	return c, nil
}

// readMainFile reads a candidate main file; a variable so that a test run as root can see a
// file it may not read.
var readMainFile = readConfigFile

// loadConfig parses the main file read at path and merges the drop-ins over it.
func loadConfig(path string, data []byte, l Lookup, loc Location) (Config, error) {
	kc, err := decodeMainConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("kubelet config %s: %w", path, err)
	}
	dir := ""
	switch {
	case l.DropInDir != "":
		dir = filepath.Join(l.HostRoot, l.DropInDir)
	case loc.DropInDir != "":
		dir = filepath.Join(l.HostRoot, loc.DropInDir)
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			dir = "" // this node's kubelet runs without --config-dir
		}
	}
	var dropIns []string
	if dir != "" {
		if kc, dropIns, err = mergeDropIns(kc, dir); err != nil {
			return Config{DropInDir: dir, DropIns: dropIns}, err
		}
	}
	c, err := kc.config()
	if err != nil {
		where := path
		if len(dropIns) > 0 {
			where = fmt.Sprintf("%s with the drop-ins of %s", path, dir)
		}
		return Config{DropInDir: dir, DropIns: dropIns}, fmt.Errorf("kubelet config %s: %w", where, err)
	}
	c.DropInDir, c.DropIns = dir, dropIns
	return c, nil
}

// dropInExt is the only extension the kubelet reads in --config-dir.
const dropInExt = ".conf"

// dropInAPIVersion and dropInKind are the only type a drop-in may have.
const (
	dropInAPIVersion = configGroup + "/v1beta1"
	dropInKind       = "KubeletConfiguration"
)

// mergeDropIns applies the drop-in files of dir over kc, as the kubelet's
// mergeKubeletConfigurations (k8s.io/kubernetes v1.37.2, cmd/kubelet/app/server.go) does:
//
//   - the base is the main file as loaded, evictionHard already defaulted (loadConfigFile),
//     marshalled to JSON;
//   - filepath.WalkDir over dir, so files in lexical order of their paths, subdirectories
//     included (walked where they sort); only names ending in ".conf" are read, the rest skipped;
//   - each drop-in must be a kubelet.config.k8s.io/v1beta1 KubeletConfiguration (apiVersion and
//     kind, exactly), and not empty;
//   - each is applied with a JSON merge patch (RFC 7386, jsonpatch.MergePatch): objects such as
//     evictionHard are merged key by key, a drop-in's key replaces the base's, a null removes
//     it, any other value replaces the whole;
//   - the result is decoded with encoding/json and defaulted (SetDefaults_KubeletConfiguration),
//     and evictionHard is not defaulted again: a drop-in that sets one evictionHard signal
//     changes only that one, and "evictionHard: null" leaves none.
//
// It returns the drop-ins applied, in order.
func mergeDropIns(kc evictionConfig, dir string) (evictionConfig, []string, error) {
	base, err := json.Marshal(kc)
	if err != nil {
		return kc, nil, fmt.Errorf("encoding the kubelet config to merge its drop-ins: %w", err)
	}
	doc, err := decodeJSONObject(base)
	if err != nil {
		return kc, nil, fmt.Errorf("encoding the kubelet config to merge its drop-ins: %w", err)
	}
	var applied []string
	err = filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() || filepath.Ext(d.Name()) != dropInExt {
			return nil
		}
		patch, err := readDropIn(path)
		if err != nil {
			return fmt.Errorf("kubelet drop-in %s: %w", path, err)
		}
		doc = mergePatch(doc, patch).(map[string]any)
		applied = append(applied, path)
		return nil
	})
	if err != nil {
		return kc, applied, fmt.Errorf("merging the kubelet's drop-ins in %s: %w", dir, err)
	}
	merged, err := json.Marshal(doc)
	if err != nil {
		return kc, applied, fmt.Errorf("merging the kubelet's drop-ins in %s: %w", dir, err)
	}
	var out evictionConfig
	if err := json.Unmarshal(merged, &out); err != nil {
		return kc, applied, fmt.Errorf("merging the kubelet's drop-ins in %s: %w", dir, err)
	}
	return out, applied, nil
}

// readDropIn reads one drop-in file into a JSON object, as the kubelet's LoadIntoJSON does: YAML
// or JSON, not empty, of the one KubeletConfiguration type.
func readDropIn(path string) (map[string]any, error) {
	data, err := readConfigFile(path)
	if err != nil {
		return nil, err
	}
	if len(data) == 0 {
		return nil, errors.New("empty")
	}
	j, err := yaml.YAMLToJSON(data)
	if err != nil {
		return nil, fmt.Errorf("parsing KubeletConfiguration: %w", err)
	}
	doc, err := decodeJSONObject(j)
	if err != nil {
		return nil, fmt.Errorf("parsing KubeletConfiguration: %w", err)
	}
	apiVersion, _ := doc["apiVersion"].(string)
	kind, _ := doc["kind"].(string)
	if apiVersion != dropInAPIVersion || kind != dropInKind {
		return nil, fmt.Errorf("apiVersion %q kind %q, want %s %s", apiVersion, kind, dropInAPIVersion, dropInKind)
	}
	return doc, nil
}

// decodeJSONObject decodes a JSON object, numbers kept as written.
func decodeJSONObject(data []byte) (map[string]any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var doc map[string]any
	if err := dec.Decode(&doc); err != nil {
		return nil, err
	}
	if doc == nil {
		return nil, errors.New("not an object")
	}
	return doc, nil
}

// mergePatch applies the JSON merge patch patch to target (RFC 7386, section 2).
func mergePatch(target, patch any) any {
	p, ok := patch.(map[string]any)
	if !ok {
		return patch
	}
	t, ok := target.(map[string]any)
	if !ok {
		t = map[string]any{}
	}
	for k, v := range p {
		if v == nil {
			delete(t, k)
			continue
		}
		t[k] = mergePatch(t[k], v)
	}
	return t
}
