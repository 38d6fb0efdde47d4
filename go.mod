module github.com/mcpexec/mcpexec

go 1.26.0
