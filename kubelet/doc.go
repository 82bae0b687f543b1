// Package kubelet will read node pressure signals (memory, disk, PID) as the kubelet computes
// them, and the kubelet's eviction thresholds. It is empty until the local-pressure work lands.
package kubelet
