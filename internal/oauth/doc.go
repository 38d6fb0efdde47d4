// Package oauth makes the front-end an OAuth 2.1 resource server: it finds
// each configured authorisation server's keys (its metadata, then its JWKS),
// validates the access tokens callers send (signature, issuer, audience per
// RFC 8707, expiry, scopes; or RFC 7662 introspection for opaque tokens) and
// says which namespace and scopes a token carries. It also serves the
// protected resource metadata of RFC 9728 and builds the WWW-Authenticate
// challenges clients follow to find the authorisation server.
//
// It writes no cryptography: signatures are checked by go-jose, with a fixed
// list of asymmetric algorithms (never "none", never HMAC).
package oauth
