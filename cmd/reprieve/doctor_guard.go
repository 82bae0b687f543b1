package main

import "github.com/reprieve-dev/reprieve/agent/guard"

// guardUnreachable says whether err is the API server's failure to call the eviction guard
// (guard.Unreachable): the agent's own check reads it the same way.
func guardUnreachable(err error) bool { return guard.Unreachable(err) }

// guardUnreachableFix is doctor's fix for it.
const guardUnreachableFix = "check that the guard's pods are ready (kubectl get deploy -A -l app.kubernetes.io/component=eviction-guard) and serve a certificate its webhook's caBundle verifies (the guard's metric reprieve_guard_ca_bundle_published, alert ReprieveEvictionGuardDown). Meanwhile every eviction of the agent is refused: at a reclaim it deletes each pod at its last safe moment, past its PodDisruptionBudget"
