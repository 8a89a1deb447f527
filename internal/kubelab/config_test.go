package kubelab

import (
	"strings"
	"testing"
)

// testConfig is a valid two-node configuration; nothing of it exists on
// the machine.
func testConfig() Config {
	return Config{
		Dir:          "/tmp/ferry-kt-unit",
		Name:         "ferry-kt",
		ControlNetNS: "/run/netns/ferry-kt-cp",
		ControlIP:    "10.91.0.1",
		Nodes: []Node{
			{Name: "n1", NetNS: "/run/netns/ferry-kt-n1", IP: "10.91.0.11", PodCIDR: "10.92.1.0/24"},
			{Name: "n2", NetNS: "/run/netns/ferry-kt-n2", IP: "10.91.0.12", PodCIDR: "10.92.2.0/24"},
		},
	}
}

func TestDefaults(t *testing.T) {
	c, err := testConfig().withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if c.Bin != DefaultCache+"/bin" || c.CNIBin != DefaultCache+"/cni" || c.PauseImageTar != DefaultCache+"/images/pause.tar" {
		t.Errorf("cache paths %q %q %q", c.Bin, c.CNIBin, c.PauseImageTar)
	}
	if c.ServiceCIDR != defaultServiceCIDR || c.ReadyTimeout != defaultReadyTimeout {
		t.Errorf("service CIDR %q, timeout %s", c.ServiceCIDR, c.ReadyTimeout)
	}
	if c.Nodes[0].Bridge != "kbr-n1" {
		t.Errorf("bridge %q", c.Nodes[0].Bridge)
	}
	long := testConfig()
	long.Nodes[0].Name = "a-rather-long-name-x"
	if c, err := long.withDefaults(); err != nil || c.Nodes[0].Bridge != "kbr-a-rather-lo" {
		t.Errorf("long node name: bridge %q, %v", c.Nodes[0].Bridge, err)
	}
	if testConfig().Nodes[0].Bridge != "" {
		t.Error("withDefaults changed the caller's nodes")
	}
}

func TestValidateRefuses(t *testing.T) {
	for name, tc := range map[string]struct {
		change func(*Config)
		want   string
	}{
		"relative dir":       {func(c *Config) { c.Dir = "lab" }, "absolute"},
		"long dir":           {func(c *Config) { c.Dir = "/tmp/" + strings.Repeat("x", 40) }, "at most 36"},
		"bad name":           {func(c *Config) { c.Name = "a/b" }, "Name"},
		"no control netns":   {func(c *Config) { c.ControlNetNS = "" }, "ControlNetNS"},
		"control ip":         {func(c *Config) { c.ControlIP = "fd00::1" }, "ControlIP"},
		"no nodes":           {func(c *Config) { c.Nodes = nil }, "no Nodes"},
		"upper-case node":    {func(c *Config) { c.Nodes[0].Name = "N1" }, "node name"},
		"twice the name":     {func(c *Config) { c.Nodes[1].Name = "n1" }, "twice"},
		"shared netns":       {func(c *Config) { c.Nodes[1].NetNS = c.Nodes[0].NetNS }, "of its own"},
		"control's netns":    {func(c *Config) { c.Nodes[0].NetNS = c.ControlNetNS }, "of its own"},
		"node ip":            {func(c *Config) { c.Nodes[0].IP = "x" }, "IP"},
		"pod cidrs overlap":  {func(c *Config) { c.Nodes[1].PodCIDR = "10.92.0.0/16" }, "overlaps"},
		"pod cidr in svc":    {func(c *Config) { c.Nodes[0].PodCIDR = "10.96.0.0/25" }, "overlaps"},
		"same bridge":        {func(c *Config) { c.Nodes[0].Bridge, c.Nodes[1].Bridge = "br", "br" }, "bridge name"},
		"bridge name length": {func(c *Config) { c.Nodes[0].Bridge = strings.Repeat("b", 16) }, "bridge name"},
		"tiny pod cidr":      {func(c *Config) { c.Nodes[0].PodCIDR = "10.92.1.0/30" }, "too small"},
	} {
		c := testConfig()
		tc.change(&c)
		_, err := c.withDefaults()
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error %v, want one mentioning %q", name, err, tc.want)
		}
	}
}
