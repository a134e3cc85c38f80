// Package api holds airlock's HTTP API contract, api/openapi.yaml, embedded
// so that the server can serve it at /v1/openapi.yaml.
package api

import _ "embed"

// OpenAPI is the OpenAPI 3.1 document describing the HTTP API.
//
//go:embed openapi.yaml
var OpenAPI []byte
