set terminal pngcairo size 900,600 noenhanced
set grid
set key top left
set linetype 1 linecolor rgb '#0072b2' linewidth 2 pointtype 5
set linetype 2 linecolor rgb '#d55e00' linewidth 2 pointtype 6
set linetype 3 linecolor rgb '#009e73' linewidth 2 pointtype 7
set linetype 4 linecolor rgb '#cc79a7' linewidth 2 pointtype 8
set linetype 5 linecolor rgb '#56b4e9' linewidth 2 pointtype 9
set linetype 6 linecolor rgb '#e69f00' linewidth 2 pointtype 10
set linetype 7 linecolor rgb '#000000' linewidth 2 pointtype 11
set linetype 8 linecolor rgb '#999999' linewidth 2 pointtype 12
set linetype cycle 8
set output 'docs/results/real/fig2.png'
set title 'fig2: decode step time vs distinct experts per layer, llama4-maverick on h200'
set xlabel 'distinct experts per layer'
set ylabel 'decode step (ms)'
$d0 << EOD
1 4.28902
EOD
$d1 << EOD
1 4.40467
2 4.52032
3 4.63597
4 4.75162
5 4.86727
6 4.98293
7 5.09858
8 5.21423
9 5.32988
10 5.44553
11 5.56118
12 5.67684
13 5.79249
14 5.90814
15 6.02379
16 6.13944
EOD
$d2 << EOD
1 4.77475
8 5.58431
15 6.39388
22 7.20344
29 8.013
36 8.82256
43 9.63213
50 10.4417
57 11.2513
64 12.0608
EOD
$d3 << EOD
1 2.12902
EOD
$d4 << EOD
1 2.24467
2 2.36032
3 2.47597
4 2.59162
5 2.70727
6 2.82293
7 2.93858
8 3.05423
9 3.16988
10 3.28553
11 3.40118
12 3.51684
13 3.63249
14 3.74814
15 3.86379
16 3.97944
EOD
$d5 << EOD
1 2.61475
8 3.42431
15 4.23388
22 5.04344
29 5.853
36 6.66256
43 7.47213
50 8.28169
57 9.09125
64 9.90081
EOD
set key below
plot $d0 using 1:2 with linespoints lt 1 dt 1 title 'per-layer overhead: preset, batch 1', $d1 using 1:2 with linespoints lt 2 dt 1 title 'per-layer overhead: preset, batch 16', $d2 using 1:2 with linespoints lt 3 dt 1 title 'per-layer overhead: preset, batch 64', $d3 using 1:2 with linespoints lt 1 dt 2 title 'per-layer overhead: zero, batch 1', $d4 using 1:2 with linespoints lt 2 dt 2 title 'per-layer overhead: zero, batch 16', $d5 using 1:2 with linespoints lt 3 dt 2 title 'per-layer overhead: zero, batch 64'
