package nodefacts

// SpotPoolSelectors are the node label selectors of the clouds' spot and preemptible pools, one
// per label: Karpenter's capacity type, an EKS managed node group's, GKE Spot and preemptible VMs,
// and AKS Spot node pools. They are the defaults of `reprieve audit --node-selector` and of the
// chart's admissionWarnings.spotNodeLabels; a node matching any one is on spot capacity.
var SpotPoolSelectors = []string{
	"karpenter.sh/capacity-type=spot",
	"eks.amazonaws.com/capacityType=SPOT",
	"cloud.google.com/gke-spot=true",
	"cloud.google.com/gke-preemptible=true",
	"kubernetes.azure.com/scalesetpriority=spot",
}
