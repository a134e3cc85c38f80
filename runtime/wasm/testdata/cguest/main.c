/* The wasm tier's C test module (clang --target=wasm32-wasi, Debian's
   wasi-libc). argv[1] picks what it does, like testdata/guest. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char *volatile keep[1024];

static int report(int ok) {
	if (ok) printf("ok\n");
	else printf("error: %s\n", strerror(errno));
	return 0;
}

int main(int argc, char **argv) {
	const char *mode = argc > 1 ? argv[1] : "hello";
	if (!strcmp(mode, "hello")) {
		printf("hello from c\n");
	} else if (!strcmp(mode, "cat")) {
		int c;
		while ((c = getchar()) != EOF) putchar(c);
	} else if (!strcmp(mode, "read") && argc > 2) {
		FILE *f = fopen(argv[2], "r");
		char buf[256];
		size_t n;
		if (!f) return report(0);
		report(1);
		while ((n = fread(buf, 1, sizeof buf, f)) > 0) fwrite(buf, 1, n, stdout);
		fclose(f);
	} else if (!strcmp(mode, "write") && argc > 2) {
		FILE *f = fopen(argv[2], "w");
		if (!f) return report(0);
		fputs("from c", f);
		return report(fclose(f) == 0);
	} else if (!strcmp(mode, "loop")) {
		volatile unsigned long i = 0;
		for (;;) i++;
	} else if (!strcmp(mode, "grow")) {
		for (unsigned long mb = 8;; mb += 8) {
			char *p = malloc(8 << 20);
			if (!p) {
				fprintf(stderr, "malloc failed after %lu MB\n", mb - 8);
				return 1;
			}
			memset(p, 1, 8 << 20);
			keep[(mb / 8) % 1024] = p;
		}
	} else if (!strcmp(mode, "print") && argc > 2) {
		char line[1024];
		memset(line, 'x', sizeof line - 1);
		line[sizeof line - 1] = '\n';
		long n = atol(argv[2]) * 1024;
		for (long i = 0; i < n; i++) fwrite(line, 1, sizeof line, stdout);
	} else {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	return 0;
}
