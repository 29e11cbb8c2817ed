// Command etcd is the upstream etcd server, built at the version that
// k8s.io/kubernetes pins, so one go.sum serves it and the Kubernetes binaries.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
