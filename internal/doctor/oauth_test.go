package doctor

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/mcpexec/mcpexec/internal/oauth/oauthtest"
)

// TestOAuthIssuerChecks: a working issuer is OK with its key count; one
// whose metadata is missing fails with a fix.
func TestOAuthIssuerChecks(t *testing.T) {
	is := oauthtest.NewIssuer(t)
	dead := httptest.NewServer(nil)
	dead.Close()
	checks := Run(context.Background(), Config{SkipNATSReason: "test", SkipSandboxReason: "test", OAuthIssuers: []string{is.URL, dead.URL}})
	var got []Check
	for _, c := range checks {
		if strings.HasPrefix(c.Name, "oauth issuer ") {
			got = append(got, c)
		}
	}
	if len(got) != 2 || got[0].Status != OK || !strings.Contains(got[0].Detail, "1 signing keys") || got[1].Status != Fail || got[1].Fix == "" {
		t.Fatalf("checks %+v", got)
	}
}
