package kubelet

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

// A kubelet whose node bootstrap gives it no configuration file takes its eviction settings from
// its command line. AKS does so on pools without a kubelet config file (Azure/AgentBaker
// pkg/agent/utils.go, IsKubeletConfigFileEnabled false): cse_config.sh writes the flags to
// /etc/default/kubelet as KUBELET_FLAGS, the unit reads that file (EnvironmentFile=) and runs
// "/opt/bin/kubelet ... $KUBELET_CONFIG_FILE_FLAGS ... $KUBELET_FLAGS"
// (parts/linux/cloud-init/artifacts/kubelet.service). This file reads that chain: systemd's
// environment file (ParseEnvironmentFile), its split of an unbraced $VAR (SplitArgs), and the
// kubelet's flags that bear on eviction (ParseKubeletFlags), with the kubelet's own semantics.

// ParseEnvironmentFile parses a systemd EnvironmentFile= as systemd does
// (src/basic/env-file.c, parse_env_file_internal and load_env_file_push):
//
//   - lines are NAME=VALUE; blanks before NAME and around "=" are skipped, a line without "="
//     is ignored, a line whose first non-blank character is '#' or ';' is a comment;
//   - a VALUE outside quotes ends at the end of the line, its trailing blanks dropped; a
//     backslash takes the next character literally, and a backslash at the end of a line
//     continues the value on the next;
//   - in single quotes everything is literal up to the next single quote; in double quotes a
//     backslash escapes '"', '\\', '`' and '$' (and a newline, which it removes) and is kept
//     before any other character; quoted and unquoted parts concatenate ("a"'b'c is abc), and
//     blanks between them are dropped;
//   - no variable is expanded, and the last assignment of a name wins;
//   - a key or value that is not valid UTF-8 fails the whole file, as in systemd.
//
// Parsing stops at a NUL byte, where systemd's C string ends.
func ParseEnvironmentFile(data []byte) (map[string]string, error) {
	const (
		preKey = iota
		key
		preValue
		value
		valueEscape
		singleQuote
		doubleQuote
		doubleQuoteEscape
		comment
		commentEscape
	)
	env := map[string]string{}
	var k, v []byte
	lastKeyBlank, lastValueBlank := -1, -1
	push := func() error {
		name := string(k)
		if lastKeyBlank >= 0 {
			name = name[:lastKeyBlank]
		}
		if !utf8.ValidString(name) || !utf8.Valid(v) {
			return fmt.Errorf("invalid UTF-8 in the assignment of %q", strings.ToValidUTF8(name, "?"))
		}
		env[name] = string(v)
		k, v = k[:0], nil
		return nil
	}
	isBlank := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	isNewline := func(c byte) bool { return c == '\n' || c == '\r' }
	state := preKey
	for _, c := range data {
		if c == 0 {
			break
		}
		switch state {
		case preKey:
			switch {
			case c == '#' || c == ';':
				state = comment
			case !isBlank(c):
				state, lastKeyBlank = key, -1
				k = append(k[:0], c)
			}
		case key:
			switch {
			case isNewline(c):
				state, k = preKey, k[:0] // no "=": ignored
			case c == '=':
				state, lastValueBlank = preValue, -1
			default:
				if !isBlank(c) {
					lastKeyBlank = -1
				} else if lastKeyBlank < 0 {
					lastKeyBlank = len(k)
				}
				k = append(k, c)
			}
		case preValue:
			switch {
			case isNewline(c):
				state = preKey
				if err := push(); err != nil {
					return nil, err
				}
			case c == '\'':
				state = singleQuote
			case c == '"':
				state = doubleQuote
			case c == '\\':
				state = valueEscape
			case !isBlank(c):
				state = value
				v = append(v, c)
			}
		case value:
			switch {
			case isNewline(c):
				state = preKey
				if lastValueBlank >= 0 {
					v = v[:lastValueBlank]
				}
				if err := push(); err != nil {
					return nil, err
				}
			case c == '\\':
				state, lastValueBlank = valueEscape, -1
			default:
				if !isBlank(c) {
					lastValueBlank = -1
				} else if lastValueBlank < 0 {
					lastValueBlank = len(v)
				}
				v = append(v, c)
			}
		case valueEscape:
			state = value
			if !isNewline(c) {
				v = append(v, c)
			}
		case singleQuote:
			if c == '\'' {
				state = preValue
			} else {
				v = append(v, c)
			}
		case doubleQuote:
			switch c {
			case '"':
				state = preValue
			case '\\':
				state = doubleQuoteEscape
			default:
				v = append(v, c)
			}
		case doubleQuoteEscape:
			state = doubleQuote
			switch {
			case strings.IndexByte("\"\\`$", c) >= 0: // SHELL_NEED_ESCAPE
				v = append(v, c)
			case c != '\n':
				v = append(v, '\\', c)
			}
		case comment:
			switch {
			case c == '\\':
				state = commentEscape
			case isNewline(c):
				state = preKey
			}
		case commentEscape:
			if isNewline(c) {
				state = preKey
			} else {
				state = comment
			}
		}
	}
	switch state {
	case preValue, value, valueEscape, singleQuote, doubleQuote, doubleQuoteEscape:
		if state == value && lastValueBlank >= 0 {
			v = v[:lastValueBlank]
		}
		if err := push(); err != nil {
			return nil, err
		}
	}
	return env, nil
}

// SplitArgs splits the value of an environment variable into the arguments that an unbraced
// $VAR, a word of its own in ExecStart=, gives the command: systemd's replace_env_argv
// (src/basic/env-util.c) splits it with strv_split_full(WHITESPACE, EXTRACT_RELAX|EXTRACT_UNQUOTE),
// that is extract_first_word (src/basic/extract-word.c):
//
//   - words are separated by runs of blanks (space, tab, newline, carriage return);
//   - single and double quotes, anywhere in a word, group blanks into it and are removed, so
//     --eviction-hard="" is the argument --eviction-hard= and "a b"c is one argument, a bc;
//   - a backslash, inside quotes or out, takes the next character literally and is removed;
//   - a quote left open, or a backslash at the end, ends the last word (EXTRACT_RELAX).
func SplitArgs(s string) []string {
	var args []string
	i := 0
	isBlank := func(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
	for {
		for i < len(s) && isBlank(s[i]) {
			i++
		}
		if i == len(s) {
			return args
		}
		var w []byte
		var quote byte
	word:
		for ; i < len(s); i++ {
			c := s[i]
			switch {
			case c == '\\':
				if i+1 == len(s) {
					i++
					break word
				}
				i++
				w = append(w, s[i])
			case quote != 0:
				if c == quote {
					quote = 0
				} else {
					w = append(w, c)
				}
			case c == '\'' || c == '"':
				quote = c
			case isBlank(c):
				break word
			default:
				w = append(w, c)
			}
		}
		args = append(args, string(w))
	}
}

// KubeletFlags are the kubelet's command-line flags that bear on eviction, as parsed by
// ParseKubeletFlags. A map or pointer left nil, and an empty path, is a flag not given.
type KubeletFlags struct {
	// EvictionHard and EvictionSoft are --eviction-hard and --eviction-soft; EvictionSoftGracePeriod
	// and EvictionMinimumReclaim --eviction-soft-grace-period and --eviction-minimum-reclaim. Given,
	// each replaces the configuration file's whole map; an empty value gives an empty map, no
	// entries at all (--eviction-hard="": no hard eviction).
	EvictionHard, EvictionSoft, EvictionSoftGracePeriod, EvictionMinimumReclaim map[string]string
	// EvictionMaxPodGracePeriod is --eviction-max-pod-grace-period, in seconds.
	EvictionMaxPodGracePeriod *int32
	// EvictionPressureTransitionPeriod and NodeStatusUpdateFrequency are
	// --eviction-pressure-transition-period and --node-status-update-frequency.
	EvictionPressureTransitionPeriod, NodeStatusUpdateFrequency *time.Duration
	// ConfigFile and ConfigDir are --config and --config-dir, as written (the kubelet reads a
	// relative one from its working directory, / for a systemd service).
	ConfigFile, ConfigDir string
	// Given lists the eviction flags read, as "--name=value" in the order given.
	Given []string
}

// HasEviction says whether any eviction flag (Given) was read.
func (f KubeletFlags) HasEviction() bool { return len(f.Given) > 0 }

// kubeletFlagKind is how the kubelet's flag set parses one of the flags read here
// (k8s.io/kubernetes v1.37.2 cmd/kubelet/app/options/options.go, AddKubeletConfigFlags and
// KubeletFlags.AddFlags).
type kubeletFlagKind int

const (
	// cliflag.NewLangleSeparatedMapStringString: --eviction-hard, --eviction-soft.
	langleMap kubeletFlagKind = iota
	// cliflag.NewMapStringString (not NoSplit): --eviction-soft-grace-period,
	// --eviction-minimum-reclaim.
	equalsMap
	// fs.Int32Var: --eviction-max-pod-grace-period.
	int32Flag
	// fs.DurationVar: --eviction-pressure-transition-period, --node-status-update-frequency.
	durationFlag
	// fs.StringVar: --config, --config-dir.
	stringFlag
)

var kubeletFlagKinds = map[string]kubeletFlagKind{
	"eviction-hard":                       langleMap,
	"eviction-soft":                       langleMap,
	"eviction-soft-grace-period":          equalsMap,
	"eviction-minimum-reclaim":            equalsMap,
	"eviction-max-pod-grace-period":       int32Flag,
	"eviction-pressure-transition-period": durationFlag,
	"node-status-update-frequency":        durationFlag,
	"config":                              stringFlag,
	"config-dir":                          stringFlag,
}

// ParseKubeletFlags reads the eviction flags, --config and --config-dir out of a kubelet
// command line (without the program name), as the kubelet's pflag flag set parses them
// (github.com/spf13/pflag FlagSet.parseArgs and parseLongArg, with the kubelet's
// cliflag.WordSepNormalizeFunc):
//
//   - "--name=value", or "--name value" taking the next argument whatever it is; a flag name's
//     '_' is read as '-' (--eviction_hard is --eviction-hard); "--" ends the flags;
//   - a map flag (cliflag MapStringString and LangleSeparatedMapStringString, Set) clears the
//     map at its first occurrence, so that a given flag replaces the configuration file's map
//     as a whole; its later occurrences add to it. Each value is split at ',', empty items
//     skipped, each item split at its first '<' (--eviction-hard, --eviction-soft) or '='
//     (--eviction-soft-grace-period, --eviction-minimum-reclaim), blanks around key and value
//     trimmed, a later key replacing an earlier one; an item without the separator is an error,
//     as the kubelet would not start;
//   - --eviction-max-pod-grace-period is strconv.ParseInt(v, 0, 32) (pflag's int32: 0x10 and
//     010 are 16 and 8), the durations time.ParseDuration, --config and --config-dir strings;
//     for these the last occurrence wins.
//
// The kubelet's other flags are skipped. Which of them take a value is not known here: one
// written "--name value" is taken to consume the next argument unless that begins with '-'
// (the kubelet refuses arguments that are not flags, so only a value can stand there).
func ParseKubeletFlags(args []string) (KubeletFlags, error) {
	var f KubeletFlags
	for len(args) > 0 {
		s := args[0]
		args = args[1:]
		if len(s) < 2 || s[0] != '-' {
			continue // not a flag: the kubelet refuses it ("unknown command")
		}
		if s == "--" {
			break
		}
		var name string
		if s[1] == '-' {
			name = s[2:]
			if name == "" || name[0] == '-' || name[0] == '=' {
				return f, fmt.Errorf("bad flag syntax: %s", s)
			}
		} else {
			name = s[1:] // a shorthand (the kubelet's -v, -h): not one of these
		}
		name, value, hasValue := strings.Cut(name, "=")
		kind, ours := kubeletFlagKinds[strings.ReplaceAll(name, "_", "-")]
		if s[1] != '-' || !ours {
			if !hasValue && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
				args = args[1:] // its value, as far as can be told
			}
			continue
		}
		name = strings.ReplaceAll(name, "_", "-")
		if !hasValue {
			if len(args) == 0 {
				return f, fmt.Errorf("flag needs an argument: %s", s)
			}
			value, args = args[0], args[1:]
		}
		if err := f.set(name, kind, value); err != nil {
			return f, fmt.Errorf("invalid argument %q for \"--%s\" flag: %w", value, name, err)
		}
		if kind != stringFlag {
			f.Given = append(f.Given, "--"+name+"="+value)
		}
	}
	return f, nil
}

// set applies one occurrence of a flag, as its pflag.Value's Set.
func (f *KubeletFlags) set(name string, kind kubeletFlagKind, value string) error {
	switch kind {
	case langleMap, equalsMap:
		m := map[string]*map[string]string{
			"eviction-hard": &f.EvictionHard, "eviction-soft": &f.EvictionSoft,
			"eviction-soft-grace-period": &f.EvictionSoftGracePeriod, "eviction-minimum-reclaim": &f.EvictionMinimumReclaim,
		}[name]
		sep, want := "<", "string<string"
		if kind == equalsMap {
			sep, want = "=", "string=string"
		}
		if *m == nil {
			*m = map[string]string{} // the first Set clears the map (its "initialized")
		}
		for item := range strings.SplitSeq(value, ",") {
			if len(item) == 0 {
				continue
			}
			k, v, ok := strings.Cut(item, sep)
			if !ok {
				return errors.New("malformed pair, expect " + want)
			}
			(*m)[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	case int32Flag:
		n, err := strconv.ParseInt(value, 0, 32)
		if err != nil {
			return err
		}
		i := int32(n)
		f.EvictionMaxPodGracePeriod = &i
	case durationFlag:
		d, err := time.ParseDuration(value)
		if err != nil {
			return err
		}
		if name == "node-status-update-frequency" {
			f.NodeStatusUpdateFrequency = &d
		} else {
			f.EvictionPressureTransitionPeriod = &d
		}
	case stringFlag:
		if name == "config" {
			f.ConfigFile = value
		} else {
			f.ConfigDir = value
		}
	}
	return nil
}

// ParseFlagsEnvironment reads the kubelet's flags from the environment file data: the words of
// its variable name (SplitArgs) parsed as the kubelet's (ParseKubeletFlags). ok is false when
// the file does not set name.
func ParseFlagsEnvironment(data []byte, name string) (f KubeletFlags, ok bool, err error) {
	env, err := ParseEnvironmentFile(data)
	if err != nil {
		return f, false, err
	}
	val, ok := env[name]
	if !ok {
		return f, false, nil
	}
	f, err = ParseKubeletFlags(SplitArgs(val))
	if err != nil {
		return f, true, fmt.Errorf("%s: %w", name, err)
	}
	return f, true, nil
}

// apply sets the flags' maps and scalars over a configuration as the kubelet's
// kubeletConfigFlagPrecedence (k8s.io/kubernetes v1.37.2 cmd/kubelet/app/server.go) does: it
// parses the whole command line again over the configuration loaded from the file and the
// drop-ins, so that a flag given wins over them (mergeDefaultEvictionSettings, a file-only
// setting, has already acted in loadConfigFile, and does not fill a flag's map).
func (f KubeletFlags) apply(kc *evictionConfig) {
	if f.EvictionHard != nil {
		kc.EvictionHard = f.EvictionHard
	}
	if f.EvictionSoft != nil {
		kc.EvictionSoft = f.EvictionSoft
	}
	if f.EvictionSoftGracePeriod != nil {
		kc.EvictionSoftGracePeriod = f.EvictionSoftGracePeriod
	}
	if f.EvictionMinimumReclaim != nil {
		kc.EvictionMinimumReclaim = f.EvictionMinimumReclaim
	}
	if f.EvictionMaxPodGracePeriod != nil {
		kc.EvictionMaxPodGracePeriod = *f.EvictionMaxPodGracePeriod
	}
}

// applyDurations sets the flags' durations over a parsed configuration. They are set after the
// defaulting (evictionConfig.config), as the kubelet parses its flags after its defaults: a
// flag's 0s stays 0s, where a file's 0s is defaulted.
func (f KubeletFlags) applyDurations(c *Config) error {
	if d := f.EvictionPressureTransitionPeriod; d != nil {
		if *d < 0 {
			return fmt.Errorf("--eviction-pressure-transition-period %v is negative", *d)
		}
		c.PressureTransitionPeriod = *d
	}
	if d := f.NodeStatusUpdateFrequency; d != nil {
		c.NodeStatusUpdateFrequency = *d
	}
	return nil
}

// Config is the eviction configuration of a kubelet run with these flags and no configuration
// file. Such a kubelet starts from NewKubeletConfiguration (cmd/kubelet/app/options), the
// v1beta1 defaults, which leave evictionHard unset: the kubelet fills in DefaultEvictionHard only
// when it loads a --config file (loadConfigFile, k8s.io/kubernetes v1.37.2; checked against
// v1.30.14 too), so without --eviction-hard it has no hard eviction thresholds at all. The
// pressure transition period and node status update frequency have their defaults (5m, 10s).
func (f KubeletFlags) Config() (Config, error) {
	return f.over(evictionConfig{})
}

// over applies the flags over kc (a file's, its drop-ins merged, or the flags-only base) and
// parses the result.
func (f KubeletFlags) over(kc evictionConfig) (Config, error) {
	f.apply(&kc)
	c, err := kc.config()
	if err != nil {
		return Config{}, err
	}
	if err := f.applyDurations(&c); err != nil {
		return Config{}, err
	}
	return c, nil
}
