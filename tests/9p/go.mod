module densevm/tests/9p

go 1.22

require github.com/hugelgupf/p9 v0.3.0

require (
	github.com/u-root/uio v0.0.0-20230305220412-3e8cd9d6bf63 // indirect
	golang.org/x/sys v0.11.0 // indirect
)
