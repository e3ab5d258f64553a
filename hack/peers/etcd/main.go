// Upstream's go.etcd.io/etcd/server/v3 main.go: the etcd server.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
