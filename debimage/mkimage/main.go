// Command mkimage builds one of debimage's images (desktop, browser) with
// mmdebstrap, cached by content, and optionally writes it as a `docker
// save` archive for `airlock image import`:
//
//	go run ./debimage/mkimage [-cache DIR] [-o desktop.tar] desktop
//
// It prints the layer's path and whether it came from the cache.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/airlock-dev/airlock/debimage"
)

func main() {
	cache := flag.String("cache", "/var/cache/airlock/images", "cache directory of built layers")
	out := flag.String("o", "", "write a docker-save archive of the image (tagged NAME:latest) to this file")
	quiet := flag.Bool("q", false, "only print mmdebstrap's output on failure")
	flag.Parse()
	names := make([]string, 0, len(debimage.Specs))
	for n := range debimage.Specs {
		names = append(names, n)
	}
	sort.Strings(names)
	if flag.NArg() != 1 || debimage.Specs[flag.Arg(0)] == nil {
		fmt.Fprintf(os.Stderr, "usage: mkimage [-cache DIR] [-o FILE] %s\n", strings.Join(names, "|"))
		os.Exit(2)
	}
	spec := debimage.Specs[flag.Arg(0)]()
	var log strings.Builder
	start := time.Now()
	var w = os.Stderr
	var layer string
	var cached bool
	var err error
	if *quiet {
		layer, cached, err = debimage.Build(context.Background(), spec, *cache, &log)
	} else {
		layer, cached, err = debimage.Build(context.Background(), spec, *cache, w)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s%v\n", log.String(), err)
		os.Exit(1)
	}
	fmt.Printf("%s cached=%v in %s\n", layer, cached, time.Since(start).Round(time.Second))
	if *out != "" {
		img, err := debimage.Image(spec, layer)
		if err == nil {
			err = debimage.WriteArchive(img, spec.Name+":latest", *out)
		}
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
