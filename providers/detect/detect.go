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

// Detect picks the provider from the node's spec.providerID (aws://, gce://, azure://), falling
// back to the machine's DMI data under hostRoot (/sys/class/dmi/id/sys_vendor and
// product_name), and last to none. Unreadable DMI files are not an error: many machines and
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
	why := fmt.Sprintf("DMI sys_vendor %q, product_name %q", vendor, product)
	switch {
	case strings.Contains(vendor, "Amazon EC2") || strings.HasPrefix(product, "Amazon EC2"):
		return Result{"aws", why}
	case strings.Contains(vendor, "Google") || strings.Contains(product, "Google Compute Engine"):
		return Result{"gcp", why}
	case strings.Contains(vendor, "Microsoft Corporation") && strings.Contains(product, "Virtual Machine"):
		return Result{"azure", why}
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
