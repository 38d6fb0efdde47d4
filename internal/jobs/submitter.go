package jobs

import "context"

// submitterKey carries, in a request's context, who is submitting.
type submitterKey struct{}

// MaxSubmitterBytes bounds Job.SubmittedBy.
const MaxSubmitterBytes = 256

// WithSubmitter returns ctx saying that who submits the jobs it carries:
// an identity the authenticator vouches for (a token's fingerprint, an
// OAuth subject), never a secret.
func WithSubmitter(ctx context.Context, who string) context.Context {
	if len(who) > MaxSubmitterBytes {
		who = who[:MaxSubmitterBytes]
	}
	return context.WithValue(ctx, submitterKey{}, who)
}

// SubmitterOf returns who ctx says submits ("" when nobody authenticated).
func SubmitterOf(ctx context.Context) string {
	who, _ := ctx.Value(submitterKey{}).(string)
	return who
}
