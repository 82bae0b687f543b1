// Package kubelet reads what the kubelet's eviction manager reads, named as the kubelet names it.
//
// It has three parts:
//
//   - Signals: memory.available, allocatableMemory.available (the pods cgroup), nodefs.available,
//     nodefs.inodesFree, imagefs.available, imagefs.inodesFree and pid.available, each an
//     Observation of what is available out of what capacity. Two Sources produce them: HostSource
//     computes them from the host's /proc, /sys and statfs under a root path (a read-only host
//     mount in the DaemonSet, fixture trees in tests), following the kubelet's own definitions
//     rather than the usual "free memory" ones, with each pod's memory and processes from the pods'
//     cgroups; and SummarySource reads the kubelet's Summary API (/stats/summary), which gives
//     every per-pod figure.
//   - Thresholds in the kubelet's syntax ("memory.available<100Mi", "nodefs.available<10%"), with
//     the kubelet's parsing rules (pkg/kubelet/eviction/helpers.go, parseThresholdStatement).
//   - Config: the eviction part of the kubelet's configuration file, with the kubelet's defaulting
//     of evictionHard (cmd/kubelet/app/server.go, loadConfigFile) and its copy of the hard
//     memory.available thresholds to allocatableMemory.available (EvictionHard), and the drop-in files of its
//     --config-dir merged over it as the kubelet merges them (mergeKubeletConfigurations).
//     FindConfig finds the file at each platform's known location (Locations) or where the caller
//     says. It is read from the host's files because /configz needs nodes/proxy, which also
//     allows exec into every pod on the node. When no file is found the configuration is unknown
//     (Config.Found false), and the caller must say so.
//
// Flags given to the kubelet on its command line (--eviction-hard and friends) are read where a
// platform writes them to a file: AKS's /etc/default/kubelet (KUBELET_FLAGS), parsed as systemd
// and the kubelet parse it (ParseFlagsEnvironment), over the configuration file as the kubelet
// applies them, or alone on AKS pools without a config file. Elsewhere only the configuration
// file and its drop-ins are read.
package kubelet
