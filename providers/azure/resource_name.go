package azure

import (
	"fmt"
	"strings"
)

// ResourceNameFromProviderID derives this machine's name in Scheduled Events' Resources from a
// node's spec.providerID, as cloud-provider-azure writes it:
//
//	azure:///subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<vmss>/virtualMachines/<id>  ->  <vmss>_<id>
//	azure:///subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<name>                                ->  <name>
//
// The first is a Uniform scale set instance (AKS node pools), the second a standalone VM or a
// Flexible scale set instance. Azure resource IDs vary in case ("resourcegroups",
// "microsoft.compute"): the fixed segments match case-insensitively; names keep their case.
func ResourceNameFromProviderID(providerID string) (string, error) {
	fail := func(why string) (string, error) {
		return "", fmt.Errorf("provider ID %q: %s", providerID, why)
	}
	const scheme = "azure://"
	if len(providerID) < len(scheme) || !strings.EqualFold(providerID[:len(scheme)], scheme) {
		return fail("not an Azure provider ID (want azure:///subscriptions/...)")
	}
	path, ok := strings.CutPrefix(providerID[len(scheme):], "/")
	if !ok {
		return fail("want azure:/// followed by a resource ID")
	}
	segs := strings.Split(path, "/")
	for _, s := range segs {
		if s == "" {
			return fail("empty path segment")
		}
	}
	// subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/<type>/<name>[/<type>/<name>]
	if len(segs) < 8 || !strings.EqualFold(segs[0], "subscriptions") || !strings.EqualFold(segs[2], "resourceGroups") ||
		!strings.EqualFold(segs[4], "providers") || !strings.EqualFold(segs[5], "Microsoft.Compute") {
		return fail("want /subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Compute/...")
	}
	rest := segs[6:]
	switch {
	case len(rest) == 2 && strings.EqualFold(rest[0], "virtualMachines"):
		return rest[1], nil
	case len(rest) == 4 && strings.EqualFold(rest[0], "virtualMachineScaleSets") && strings.EqualFold(rest[2], "virtualMachines"):
		// Scheduled Events and IMDS compute.name join scale set and instance ID with "_".
		return rest[1] + "_" + rest[3], nil
	}
	return fail("want .../virtualMachines/<name> or .../virtualMachineScaleSets/<vmss>/virtualMachines/<id>")
}
