// Package detect works out which cloud a node runs on, for --provider auto.
package detect

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
)

// Result is the detected provider and why.
type Result struct {
	// Provider is "aws", "gcp", "azure" or "none".
	Provider string
	// Reason says what decided it, for the start-up log.
	Reason string
}

// AzureChassisAssetTag is the DMI chassis_asset_tag of every Azure VM. Hyper-V on premises
// reports the same sys_vendor and product_name ("Microsoft Corporation", "Virtual Machine"),
// so only this tag tells Azure apart (cloud-init's ds-identify, dscheck_Azure).
const AzureChassisAssetTag = "7783-7084-3265-9085-8269-3286-77"

// Detect picks the provider from the node's spec.providerID (aws://, gce://, azure://), falling
// back to the machine's DMI data under hostRoot, and last to none. As cloud-init's ds-identify
// does: Azure by chassis_asset_tag alone; EC2 by the Nitro vendor strings, or on Xen
// generations by /sys/hypervisor/uuid, product_uuid or product_serial starting with "ec2";
// GCE by its vendor or product name. Unreadable DMI files are not an error: many machines and
// containers have none; the reason then says so.
func Detect(providerID, hostRoot string) Result {
	switch scheme, _, _ := strings.Cut(providerID, "://"); strings.ToLower(scheme) {
	case "aws":
		return Result{"aws", fmt.Sprintf("node spec.providerID %q", providerID)}
	case "gce":
		return Result{"gcp", fmt.Sprintf("node spec.providerID %q", providerID)}
	case "azure":
		return Result{"azure", fmt.Sprintf("node spec.providerID %q", providerID)}
	}
	dir := filepath.Join(hostRoot, "sys", "class", "dmi", "id")
	vendor, verr := readTrim(filepath.Join(dir, "sys_vendor"))
	product, _ := readTrim(filepath.Join(dir, "product_name"))
	assetTag, _ := readTrim(filepath.Join(dir, "chassis_asset_tag"))
	why := fmt.Sprintf("DMI sys_vendor %q, product_name %q", vendor, product)
	for _, id := range []struct{ path, name string }{
		{filepath.Join(hostRoot, "sys", "hypervisor", "uuid"), "/sys/hypervisor/uuid"},
		{filepath.Join(dir, "product_uuid"), "DMI product_uuid"},
		{filepath.Join(dir, "product_serial"), "DMI product_serial"},
	} {
		// Xen-based EC2 instances: the UUID or serial starts with ec2 (either case).
		if v, err := readTrim(id.path); err == nil && strings.HasPrefix(strings.ToLower(v), "ec2") {
			return Result{"aws", fmt.Sprintf("%s %q starts with ec2", id.name, v)}
		}
	}
	switch {
	case assetTag == AzureChassisAssetTag:
		return Result{"azure", fmt.Sprintf("DMI chassis_asset_tag %q (Azure's)", assetTag)}
	case strings.Contains(vendor, "Amazon EC2") || strings.HasPrefix(product, "Amazon EC2"):
		return Result{"aws", why}
	case strings.Contains(vendor, "Google") || strings.Contains(product, "Google Compute Engine"):
		return Result{"gcp", why}
	case strings.Contains(vendor, "Microsoft Corporation") && strings.Contains(product, "Virtual Machine"):
		// Hyper-V without Azure's asset tag: on premises. Polling Azure's IMDS there would
		// fail forever.
		return Result{"none", fmt.Sprintf("Hyper-V (%s) without Azure's chassis_asset_tag (got %q): not Azure; the deadline then comes from the node annotation reprieve.io/reclaim-deadline", why, assetTag)}
	}
	reason := fmt.Sprintf("no cloud recognised: providerID %q, %s", providerID, why)
	if verr != nil && errors.Is(verr, fs.ErrNotExist) {
		reason = fmt.Sprintf("no cloud recognised: providerID %q and no DMI data under %s", providerID, dir)
	}
	return Result{"none", reason + "; the deadline then comes from the node annotation reprieve.io/reclaim-deadline"}
}

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
