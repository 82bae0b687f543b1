// Package deploy holds reprieve's deployment files: the manifests, the Prometheus alert rules,
// PodMonitor and PrometheusRule, and the Grafana dashboard. It has no code; its tests check that
// the files agree with each other and with the metrics the agent registers.
package deploy
