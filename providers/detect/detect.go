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
// so only this tag tells Azure apart (cloud-init's ds-identify, is_azure_chassis).
const AzureChassisAssetTag = "7783-7084-3265-9085-8269-3286-77"

// annotationNote ends the reason of a none result: where the deadline then comes from.
const annotationNote = "; the deadline then comes from the node annotation reprieve.io/reclaim-deadline"

// Detect picks the provider from the node's spec.providerID (aws://, gce://, azure://), falling
// back to the machine's DMI data under hostRoot (see FromHost), and last to none. Unreadable DMI
// files are not an error: many machines and containers have none; the reason then says so.
//
// The agent asks FromHost first and reads the node only when the host names no cloud, so that
// it starts without the API server; Detect is the whole decision once the providerID is known.
func Detect(providerID, hostRoot string) Result {
	switch scheme, _, _ := strings.Cut(providerID, "://"); strings.ToLower(scheme) {
	case "aws":
		return Result{"aws", fmt.Sprintf("node spec.providerID %q", providerID)}
	case "gce":
		return Result{"gcp", fmt.Sprintf("node spec.providerID %q", providerID)}
	case "azure":
		return Result{"azure", fmt.Sprintf("node spec.providerID %q", providerID)}
	}
	r, _ := FromHost(hostRoot)
	if r.Provider == "none" {
		r.Reason = fmt.Sprintf("no cloud recognised: providerID %q, %s", providerID, r.Reason)
	}
	return r
}

// FromHost detects the cloud from the machine's DMI data under hostRoot (the same from inside a
// container: sysfs is not namespaced), with no API server. ok is true only when the data names
// a cloud; otherwise the result is none, and its reason says what was found (nothing, bare
// metal, on-premises Hyper-V), so that the caller can ask the node's providerID.
//
// As cloud-init's ds-identify: Azure by chassis_asset_tag alone (is_azure_chassis); EC2 on Xen
// by /sys/hypervisor/uuid, product_uuid or product_serial starting with "ec2" (ec2_identify_platform;
// AWS, "Detect whether a host is an EC2 instance"); GCE by product_name "Google Compute Engine"
// (dscheck_GCE). As systemd's detect_vm_dmi_vendor (src/basic/virt.c), which reads sys_vendor,
// product_name and bios_vendor alike: EC2 Nitro by "Amazon EC2" in sys_vendor, product_name or
// bios_vendor. GCE also by sys_vendor or bios_vendor "Google" (what GCE's firmware reports;
// cloud.google.com/go/compute/metadata's systemInfoSuggestsGCE accepts product_name "Google").
// product_uuid and product_serial are readable by root only; an agent running as another user
// relies on the other files, which are world-readable.
func FromHost(hostRoot string) (r Result, ok bool) {
	dir := filepath.Join(hostRoot, "sys", "class", "dmi", "id")
	vendor, verr := readTrim(filepath.Join(dir, "sys_vendor"))
	product, _ := readTrim(filepath.Join(dir, "product_name"))
	bios, _ := readTrim(filepath.Join(dir, "bios_vendor"))
	assetTag, _ := readTrim(filepath.Join(dir, "chassis_asset_tag"))
	why := fmt.Sprintf("DMI sys_vendor %q, product_name %q", vendor, product)
	if bios != "" {
		why += fmt.Sprintf(", bios_vendor %q", bios)
	}
	for _, id := range []struct{ path, name string }{
		{filepath.Join(hostRoot, "sys", "hypervisor", "uuid"), "/sys/hypervisor/uuid"},
		{filepath.Join(dir, "product_uuid"), "DMI product_uuid"},
		{filepath.Join(dir, "product_serial"), "DMI product_serial"},
	} {
		// Xen-based EC2 instances: the UUID or serial starts with ec2 (either case).
		if v, err := readTrim(id.path); err == nil && strings.HasPrefix(strings.ToLower(v), "ec2") {
			return Result{"aws", fmt.Sprintf("%s %q starts with ec2", id.name, v)}, true
		}
	}
	switch {
	case assetTag == AzureChassisAssetTag:
		return Result{"azure", fmt.Sprintf("DMI chassis_asset_tag %q (Azure's)", assetTag)}, true
	case strings.Contains(vendor, "Amazon EC2") || strings.HasPrefix(product, "Amazon EC2") || strings.HasPrefix(bios, "Amazon EC2"):
		return Result{"aws", why}, true
	case strings.Contains(vendor, "Google") || strings.Contains(product, "Google Compute Engine") || bios == "Google":
		return Result{"gcp", why}, true
	case strings.Contains(vendor, "Microsoft Corporation") && strings.Contains(product, "Virtual Machine"):
		// Hyper-V without Azure's asset tag: on premises. Polling Azure's IMDS there would
		// fail forever.
		return Result{"none", fmt.Sprintf("Hyper-V (%s) without Azure's chassis_asset_tag (got %q): not Azure%s", why, assetTag, annotationNote)}, false
	}
	if verr != nil && errors.Is(verr, fs.ErrNotExist) {
		return Result{"none", fmt.Sprintf("no DMI data under %s%s", dir, annotationNote)}, false
	}
	return Result{"none", why + annotationNote}, false
}

func readTrim(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}
