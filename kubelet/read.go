package kubelet

// ConfigRead is one read of the kubelet's configuration (Find): a process reads it once
// and hands the value to everything that uses it (the interruption plan's shutdown cut, the
// volume release, the pressure thresholds, the what-if plan, doctor), so that they all see the
// same file as it was read.
type ConfigRead struct {
	// Config is what was read; Found is false when no file was found (the kubelet's defaults).
	Config Config
	// Err says why a file found could not be read or parsed.
	Err error
}

// Find is FindConfig's answer as one value.
func Find(l Lookup) ConfigRead {
	kc, err := FindConfig(l)
	return ConfigRead{Config: kc, Err: err}
}

// Known says whether the kubelet's configuration was found and read.
func (r ConfigRead) Known() bool { return r.Err == nil && r.Config.Found }
