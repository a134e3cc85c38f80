// Command guest is the module the wasm tier's tests run (built with
// GOOS=wasip1 GOARCH=wasm). argv[1] picks what it does.
package main

import (
	"bufio"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) < 2 {
		fmt.Println("hello from wasm")
		return
	}
	arg := func(i int) string {
		if len(os.Args) > i {
			return os.Args[i]
		}
		return ""
	}
	switch os.Args[1] {
	case "cat": // stdin to stdout
		_, _ = io.Copy(os.Stdout, os.Stdin)
	case "env":
		for _, kv := range os.Environ() {
			fmt.Println(kv)
		}
	case "args":
		fmt.Println(strings.Join(os.Args, "|"))
	case "exit":
		n, _ := strconv.Atoi(arg(2))
		fmt.Fprintln(os.Stderr, "exiting", n)
		os.Exit(n)
	case "read": // print a file
		b, err := os.ReadFile(arg(2))
		report(err)
		os.Stdout.Write(b)
	case "seek": // print a file from byte argv[3] on (fd_seek)
		f, err := os.Open(arg(2))
		report(err)
		off, _ := strconv.ParseInt(arg(3), 10, 64)
		if _, err := f.Seek(off, io.SeekStart); err != nil {
			report(err)
		}
		b, _ := io.ReadAll(f)
		os.Stdout.Write(b)
	case "write": // write a file
		report(os.WriteFile(arg(2), []byte(arg(3)), 0o644))
	case "mkdir":
		report(os.Mkdir(arg(2), 0o755))
	case "remove":
		report(os.Remove(arg(2)))
	case "symlink":
		report(os.Symlink(arg(2), arg(3)))
	case "openat": // path_open on preopen fd argv[2] with a raw path
		fd, _ := strconv.Atoi(arg(2))
		f, err := syscall.Openat(fd, arg(3), syscall.O_RDONLY, 0)
		if err == nil {
			b := make([]byte, 4096)
			n, _ := syscall.Read(f, b)
			os.Stdout.Write(b[:n])
		}
		report(err)
	case "fill": // write 1 MiB chunks to a file until a write fails
		f, err := os.Create(arg(2))
		if err != nil {
			report(err)
			return
		}
		chunk := make([]byte, 1<<20)
		n := 0
		for ; n < 64; n++ {
			if _, err = f.Write(chunk); err != nil {
				break
			}
		}
		f.Close()
		fmt.Println("wrote", n, "MiB")
		report(err)
	case "files": // create empty files in a directory until that fails
		var err error
		n := 0
		for ; n < 1000; n++ {
			var f *os.File
			if f, err = os.Create(fmt.Sprintf("%s/f%d", arg(2), n)); err != nil {
				break
			}
			f.Close()
		}
		fmt.Println("created", n)
		report(err)
	case "loop":
		for i := 0; ; i++ {
			if i < 0 {
				fmt.Println(i)
			}
		}
	case "sleep":
		time.Sleep(time.Hour)
	case "grow": // allocate until the memory runs out
		var keep [][]byte
		for {
			b := make([]byte, 8<<20)
			for i := range b {
				b[i] = 1
			}
			keep = append(keep, b)
			fmt.Println(len(keep) * 8)
		}
	case "print": // print argv[2] MB
		n, _ := strconv.Atoi(arg(2))
		w := bufio.NewWriterSize(os.Stdout, 1<<16)
		line := strings.Repeat("x", 1023) + "\n"
		for i := 0; i < n*1024; i++ {
			w.WriteString(line)
		}
		w.Flush()
	case "dial":
		c, err := net.Dial("tcp", arg(2))
		if err == nil {
			c.Close()
		}
		report(err)
	case "clock":
		fmt.Println(time.Now().Unix())
	case "random":
		b := make([]byte, 16)
		_, _ = rand.Read(b)
		fmt.Printf("%x\n", b)
	default:
		fmt.Fprintln(os.Stderr, "unknown mode", os.Args[1])
		os.Exit(2)
	}
}

// report prints "ok" or the error, so the host can check what happened.
func report(err error) {
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	fmt.Println("ok")
}
