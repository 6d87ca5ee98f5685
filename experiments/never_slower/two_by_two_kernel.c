// The Q4_1 x Q8_1 kernel alone, stock call pattern against the two-by-two one (patches/), on rows streamed from
// memory: docs/engine.md "ggml's two-by-two kernels" quotes it. Random blocks with small finite fp16 scales.
//
//   experiments/never_slower/two_by_two_builds.sh /tmp/two-by-two       (builds both libggml-cpu)
//   gcc -O2 -o /tmp/kernel experiments/never_slower/two_by_two_kernel.c -lggml-cpu -lggml-base
//       -L/tmp/two-by-two/src-patched/build/bin        (one command line)
//   LD_LIBRARY_PATH=/tmp/two-by-two/src-patched/build/bin /tmp/kernel 30 100000     (repeats, rows of 576)
//
// Prints the time of one column (one token), of two columns by one-row calls (as a stock multi-token pass does,
// 16-row blocks), and of two columns by two-by-two calls, and whether the last two agree bit for bit.
#include <stdio.h>
#include <stdlib.h>
#include <stdint.h>
#include <time.h>
void ggml_vec_dot_q4_1_q8_1(int n, float * s, size_t bs, const void * vx, size_t bx, const void * vy, size_t by, int nrc);
static double now(){struct timespec t; clock_gettime(CLOCK_MONOTONIC,&t); return t.tv_sec+1e-9*t.tv_nsec;}
int main(int argc, char**argv){
  int n = 576, rows = atoi(argv[2]), nb = n/32, reps = atoi(argv[1]);
  size_t bx = nb*20, by = nb*36;
  uint8_t *x = malloc(bx*rows), *y = malloc(by*2);
  for (size_t i=0;i<bx*rows;i++) x[i]=rand();
  for (size_t i=0;i<by*2;i++) y[i]=rand();
  for (int r=0;r<rows;r++) for(int b=0;b<nb;b++){ uint16_t*h=(uint16_t*)(x+r*bx+b*20); h[0]=0x2000+(rand()&0xff); h[1]=0x2000+(rand()&0xff);}
  for (int c=0;c<2;c++) for(int b=0;b<nb;b++){ uint16_t*h=(uint16_t*)(y+c*by+b*36); h[0]=0x2000+(rand()&0xff); h[1]=0x2000+(rand()&0xff);}
  float tmp[32]; volatile float sink=0;
  double t0=now();
  for (int k=0;k<reps;k++) for (int r0=0;r0<rows;r0+=16) for (int r=r0;r<r0+16;r++) { ggml_vec_dot_q4_1_q8_1(n, tmp, 0, x+r*bx, 0, y, 0, 1); sink+=tmp[0]; }
  double t1=now();
  for (int k=0;k<reps;k++) for (int r0=0;r0<rows;r0+=16) for (int c=0;c<2;c++) for (int r=r0;r<r0+16;r++) { ggml_vec_dot_q4_1_q8_1(n, tmp, 0, x+r*bx, 0, y+c*by, 0, 1); sink+=tmp[0]; }
  double t2=now();
  for (int k=0;k<reps;k++) for (int r0=0;r0<rows;r0+=16) for (int r=r0;r<r0+16;r+=2) { ggml_vec_dot_q4_1_q8_1(n, tmp, 16, x+r*bx, bx, y, by, 2); sink+=tmp[0]; }
  double t3=now();
  // bit for bit: every output of the two-by-two calls against the one-row calls
  int same = 1;
  for (int r=0;r<rows && same;r+=2) {
    float one[4];
    for (int c=0;c<2;c++) for (int k=0;k<2;k++) ggml_vec_dot_q4_1_q8_1(n, &one[c*2+k], 0, x+(r+k)*bx, 0, y+c*by, 0, 1);
    ggml_vec_dot_q4_1_q8_1(n, tmp, 16, x+r*bx, bx, y, by, 2);
    same = tmp[0]==one[0] && tmp[1]==one[1] && tmp[16]==one[2] && tmp[17]==one[3];
  }
  double a=(t1-t0)/reps*1e3, b=(t2-t1)/reps*1e3, c=(t3-t2)/reps*1e3;
  printf("rows %d (%.1f MB): 1 col %.3f ms | 2 cols nrc=1 %.3f ms (%.2fx) | 2 cols nrc=2 %.3f ms (%.2fx) | bit-identical %d\n",
         rows, bx*rows/1e6, a, b, b/a, c, c/a, same);
  return 0;
}
