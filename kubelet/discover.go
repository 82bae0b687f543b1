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
	// FlagsFile is the systemd EnvironmentFile whose variable FlagsVar holds flags the kubelet is
	// run with, "" for none read; ConfigUnit is the systemd drop-in that adds --config Path to
	// the kubelet's command line when the platform runs it with the file. AKS's flags override
	// its file, or stand alone on pools without one: see FindConfig.
	FlagsFile, FlagsVar, ConfigUnit string
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
	// The flags: nodeadm/internal/kubelet/environment.go (writeKubeletEnvironment) writes every
	// flag it sets (--config, --config-dir, --node-ip, --hostname-override, ...) as
	// NODEADM_KUBELET_ARGS to /etc/eks/kubelet/environment (0644, kubeletConfigPerm), with the
	// NodeConfig's spec.kubelet.flags appended last "to give them precedence", and the AL2023
	// unit (templates/al2023/runtime/rootfs/etc/systemd/system/kubelet.service) runs
	// "EnvironmentFile=/etc/eks/kubelet/environment" and "ExecStart=/usr/bin/kubelet
	// $NODEADM_KUBELET_ARGS": a user's --eviction-hard or --node-status-update-frequency there
	// wins over config.json and its drop-ins, as the kubelet applies flags last.
	{Platform: "EKS AL2023 (nodeadm)", Path: "/etc/kubernetes/kubelet/config.json", DropInDir: "/etc/kubernetes/kubelet/config.json.d",
		FlagsFile: "/etc/eks/kubelet/environment", FlagsVar: "NODEADM_KUBELET_ARGS"},
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
	// The flags: cse_config.sh (ensureKubelet) writes KUBELET_FLAGS to /etc/default/kubelet, the
	// unit's EnvironmentFile, and kubelet.service runs "... $KUBELET_CONFIG_FILE_FLAGS ...
	// $KUBELET_FLAGS"; with the config file enabled, the drop-in 10-componentconfig.conf sets
	// KUBELET_CONFIG_FILE_FLAGS and pkg/agent/utils.go (TranslatedKubeletConfigFlags) moves the
	// eviction flags out of KUBELET_FLAGS into the file. Without it they stay flags.
	{Platform: "AKS", Path: "/etc/default/kubeletconfig.json",
		FlagsFile: "/etc/default/kubelet", FlagsVar: "KUBELET_FLAGS",
		ConfigUnit: "/etc/systemd/system/kubelet.service.d/10-componentconfig.conf"},
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
//
// A location with a flags file (AKS's /etc/default/kubelet) is read with the kubelet's flags of
// that file (ParseFlagsEnvironment), which the kubelet applies over its file and drop-ins
// (kubeletConfigFlagPrecedence):
//
//   - the file found and the flags with eviction flags: the flags' values over the file's
//     (Platform "AKS (config file and kubelet flags)", Path the file, FlagsFile the flags file);
//   - the file absent, and the kubelet not run with a --config (no --config among the flags and
//     no ConfigUnit): the kubelet runs on its flags alone, a configuration as known as a file's
//     (Found, Platform "AKS (kubelet flags)", Path the flags file, after the later locations
//     are found without a file: a node of another platform keeps its file). AgentBaker always writes the
//     flags file, and a flag it does not write is the kubelet's built-in value: with no eviction
//     flag at all the kubelet's flag defaults apply, which have no hard threshold
//     (KubeletFlags.Config). A kubelet run with a --config that is absent would not start: that
//     is unknown, and the search goes on;
//   - the file there but not readable by this process, and eviction flags: those flags, over the
//     kubelet's flag defaults, are taken as the configuration (Platform "AKS (kubelet flags)"),
//     the unreadable file said in Searched. AgentBaker moves every eviction flag
//     (TranslatedKubeletConfigFlags) into the file when it writes one, so eviction flags on the
//     command line mean that this kubelet's eviction settings are not the file's. Without
//     eviction flags it is unknown, as before;
//   - a flags file that exists but may not be read (cse_config.sh makes it 0600 on current
//     AgentBaker) changes nothing where the file is found; otherwise it is said in Searched.
//
// The flags alone are taken only in the search (no Path): an explicit Path keeps its rule, and
// the AKS file named explicitly is read with the flags over it, or is unknown. A --config among
// the flags names the main file in place of the location's (the kubelet takes the last
// --config, and $KUBELET_FLAGS comes last), unless Path is explicit; a --config-dir among them is
// the drop-in directory, unless DropInDir is explicit.
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
	// flagsOnly is the location whose kubelet runs on its flags alone, taken when no later
	// location has a file: a node of another platform that sets KUBELET_FLAGS keeps its file.
	var flagsOnly *Location
	var flagsOnlyRead flagsRead
	for _, loc := range candidates {
		fr, err := readLocationFlags(l.HostRoot, loc)
		if err != nil {
			return Config{Path: fr.path, Platform: loc.Platform, Searched: append(searched, fr.path)}, err
		}
		mainPath := loc.Path
		if fr.set && fr.flags.ConfigFile != "" && l.Path == "" {
			mainPath = hostPath(fr.flags.ConfigFile)
		}
		path := filepath.Join(l.HostRoot, mainPath)
		searched = append(searched, path)
		data, err := readMainFile(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
			switch {
			case fr.set && l.Path == "" && !fr.withConfig(l.HostRoot, loc):
				if flagsOnly == nil {
					flagsOnly, flagsOnlyRead = &loc, fr
				}
			case fr.denied != nil:
				searched = append(searched, deniedNote(fr.path, fr.denied))
			}
			continue // absent, or a parent is a file: not there either
		}
		if errors.Is(err, fs.ErrPermission) {
			// There, but not for this process: AKS writes /etc/default/kubeletconfig.json 0600,
			// root's only, and the agent runs as non-root. Unknown, and said so (Searched), not
			// an error that would turn pressure handling off on every such node.
			searched[len(searched)-1] = deniedNote(path, err)
			if fr.set && l.Path == "" && fr.flags.HasEviction() {
				return flagsOnlyConfig(l, loc, fr, append(searched, fr.path))
			}
			c := DefaultConfig()
			c.Path, c.Platform, c.Searched = path, loc.Platform, searched
			return c, nil
		}
		if err != nil {
			return Config{Path: path, Searched: searched}, fmt.Errorf("reading kubelet config: %w", err)
		}
		c, err := loadConfig(path, data, l, loc, fr)
		c.Path, c.Platform, c.Searched = path, loc.Platform, searched
		if fr.set {
			c.FlagsFile, c.Flags = fr.path, fr.flags.Given
			if fr.flags.HasEviction() {
				c.Platform = loc.Platform + " (config file and kubelet flags)"
			}
		}
		if err != nil {
			return c, err
		}
		c.Found = true
		return c, nil
	}
	if flagsOnly != nil {
		return flagsOnlyConfig(l, *flagsOnly, flagsOnlyRead, append(searched, flagsOnlyRead.path))
	}
	c := DefaultConfig()
	c.Searched = searched
	if l.Path != "" {
		c.Path = searched[0]
	}
	return c, nil
}

// deniedNote is the Searched entry of a file this process may not read.
func deniedNote(path string, err error) string {
	return fmt.Sprintf("%s (exists, not readable by this process: %v)", path, err)
}

// hostPath is the host's absolute path of a path the kubelet was given: a relative one is read
// from its working directory, / for a systemd service.
func hostPath(p string) string {
	if filepath.IsAbs(p) {
		return filepath.Clean(p)
	}
	return filepath.Join("/", p)
}

// flagsRead is what readLocationFlags found in a location's flags file.
type flagsRead struct {
	path  string // under the host root; "" when the location has none
	set   bool   // the file sets the location's FlagsVar: flags holds them
	flags KubeletFlags
	// denied is why this process may not read the file, which exists.
	denied error
}

// withConfig says whether the kubelet is run with a --config file: one among its flags, or the
// platform's systemd drop-in that adds it. A drop-in whose presence cannot be told counts as
// there, which leaves the configuration unknown rather than wrongly the flags' alone.
func (fr flagsRead) withConfig(root string, loc Location) bool {
	if fr.flags.ConfigFile != "" {
		return true
	}
	if loc.ConfigUnit == "" {
		return false
	}
	_, err := os.Stat(filepath.Join(root, loc.ConfigUnit))
	return !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, syscall.ENOTDIR)
}

// readFlagsFile reads a location's flags file; a variable so that a test run as root can see a
// file it may not read.
var readFlagsFile = readConfigFile

// readLocationFlags reads the flags of a location's flags file (Location.FlagsFile), if it has
// one. An absent file, or one without the variable (GKE's /etc/default/kubelet sets
// KUBELET_OPTS), is none; one that does not parse is an error naming it, as the kubelet would
// not start with it.
func readLocationFlags(root string, loc Location) (flagsRead, error) {
	if loc.FlagsFile == "" {
		return flagsRead{}, nil
	}
	fr := flagsRead{path: filepath.Join(root, loc.FlagsFile)}
	data, err := readFlagsFile(fr.path)
	switch {
	case errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR):
		return fr, nil
	case errors.Is(err, fs.ErrPermission):
		fr.denied = err
		return fr, nil
	case err != nil:
		return fr, fmt.Errorf("reading the kubelet's flags: %w", err)
	}
	fr.flags, fr.set, err = ParseFlagsEnvironment(data, loc.FlagsVar)
	if err != nil {
		return fr, fmt.Errorf("kubelet flags %s: %w", fr.path, err)
	}
	return fr, nil
}

// flagsOnlyConfig is the configuration of a kubelet run on its flags (fr) without a config
// file, found at fr.path: the flags over the kubelet's flag defaults, with the drop-ins of a
// --config-dir (or an explicit DropInDir) merged between, as the kubelet merges them.
func flagsOnlyConfig(l Lookup, loc Location, fr flagsRead, searched []string) (Config, error) {
	var kc evictionConfig // NewKubeletConfiguration: evictionHard unset (KubeletFlags.Config)
	dir, err := dropInDir(l, loc, fr)
	var dropIns []string
	if err == nil && dir != "" {
		kc, dropIns, err = mergeDropIns(kc, dir)
	}
	var c Config
	if err == nil {
		if c, err = fr.flags.over(kc); err != nil {
			err = fmt.Errorf("kubelet flags %s: %w", fr.path, err)
		}
	}
	c.Path, c.Platform, c.Searched = fr.path, loc.Platform+" (kubelet flags)", searched
	c.DropInDir, c.DropIns = dir, dropIns
	c.FlagsFile, c.Flags = fr.path, fr.flags.Given
	if err != nil {
		return c, err
	}
	c.Found = true
	return c, nil
}

// readMainFile reads a candidate main file; a variable so that a test run as root can see a
// file it may not read.
var readMainFile = readConfigFile

// dropInDir is the drop-in directory to merge: DropInDir when given (it must exist), else the
// --config-dir among the kubelet's flags (it must exist, or the kubelet would not start), else
// the location's if it exists.
func dropInDir(l Lookup, loc Location, fr flagsRead) (string, error) {
	switch {
	case l.DropInDir != "":
		return filepath.Join(l.HostRoot, l.DropInDir), nil
	case fr.set && fr.flags.ConfigDir != "":
		dir := filepath.Join(l.HostRoot, hostPath(fr.flags.ConfigDir))
		if _, err := os.Stat(dir); err != nil {
			return dir, fmt.Errorf("the kubelet's --config-dir (in %s): %w", fr.path, err)
		}
		return dir, nil
	case loc.DropInDir != "":
		dir := filepath.Join(l.HostRoot, loc.DropInDir)
		if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
			return "", nil // this node's kubelet runs without --config-dir
		}
		return dir, nil
	}
	return "", nil
}

// loadConfig parses the main file read at path, merges the drop-ins over it, and the kubelet's
// flags (fr) over both.
func loadConfig(path string, data []byte, l Lookup, loc Location, fr flagsRead) (Config, error) {
	kc, err := decodeMainConfig(data)
	if err != nil {
		return Config{}, fmt.Errorf("kubelet config %s: %w", path, err)
	}
	dir, err := dropInDir(l, loc, fr)
	if err != nil {
		return Config{DropInDir: dir}, err
	}
	var dropIns []string
	if dir != "" {
		if kc, dropIns, err = mergeDropIns(kc, dir); err != nil {
			return Config{DropInDir: dir, DropIns: dropIns}, err
		}
	}
	c, err := fr.flags.over(kc)
	if err != nil {
		where := path
		if len(dropIns) > 0 {
			where = fmt.Sprintf("%s with the drop-ins of %s", path, dir)
		}
		if fr.flags.HasEviction() {
			where += " and the kubelet flags of " + fr.path
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
