package wasm

// HelloOutput is what HelloModule prints.
const HelloOutput = "hello from wasm\n"

// HelloModule returns a minimal WASI preview 1 command module (138 bytes,
// assembled by hand below) whose _start writes HelloOutput to stdout with
// one fd_write. `airlock doctor` and `airlock bench` run it, so neither
// needs a toolchain.
func HelloModule() []byte {
	msg := []byte(HelloOutput) // 16 bytes at offset 8, after its iovec
	data := append([]byte{8, 0, 0, 0, byte(len(msg)), 0, 0, 0}, msg...)
	str := func(s string) []byte { return append([]byte{byte(len(s))}, s...) }
	section := func(id byte, body ...[]byte) []byte {
		var b []byte
		for _, p := range body {
			b = append(b, p...)
		}
		return append([]byte{id, byte(len(b))}, b...)
	}
	code := []byte{
		0x00,       // no locals
		0x41, 0x01, // i32.const 1 (stdout)
		0x41, 0x00, // i32.const 0 (iovec)
		0x41, 0x01, // i32.const 1 (one iovec)
		0x41, byte(len(data)), // i32.const: where nwritten goes
		0x10, 0x00, // call fd_write
		0x1a, // drop
		0x0b, // end
	}
	var m []byte
	m = append(m, 0x00, 0x61, 0x73, 0x6d, 0x01, 0x00, 0x00, 0x00)
	m = append(m, section(1, []byte{0x02,
		0x60, 0x04, 0x7f, 0x7f, 0x7f, 0x7f, 0x01, 0x7f, // (i32 i32 i32 i32) -> i32
		0x60, 0x00, 0x00})...) // () -> ()
	m = append(m, section(2, []byte{0x01}, str("wasi_snapshot_preview1"), str("fd_write"), []byte{0x00, 0x00})...)
	m = append(m, section(3, []byte{0x01, 0x01})...)       // one function of type 1
	m = append(m, section(5, []byte{0x01, 0x00, 0x01})...) // one memory, 1 page
	m = append(m, section(7, []byte{0x02}, str("memory"), []byte{0x02, 0x00}, str("_start"), []byte{0x00, 0x01})...)
	m = append(m, section(10, []byte{0x01, byte(len(code))}, code)...)
	m = append(m, section(11, []byte{0x01, 0x00, 0x41, 0x00, 0x0b, byte(len(data))}, data)...)
	return m
}
